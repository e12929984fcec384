"""A few tensors at a time from torch files that hold many: the plain engine's model-states files, Megatron's rank
files and DeepSpeed's optimizer files hold every model piece (the optimizer's of each Adam kind), and a converter
takes one piece of one kind at a time. Loading such a file again for each take unpickled all of it each time (most
of a conversion's time), and a memory map kept open across pieces would leave every page read counted in the
process's memory. So a zip-format file's pickle is read once, its tensors on the meta device, where torch notes
each storage's offset in the file, and each take maps the file anew and views the tensors taken there (as
torch.load's memory map would), the map closing when they are dropped. A file in
torch's legacy format cannot be read in parts; it is loaded whole at each take, and so is every file where the
torch in use does not mark the offsets (`_checkpoint_offset`, set by torch.load for the meta device since 2.x)."""
import os
import sys
import zipfile
from typing import Callable, Dict, Hashable, Iterable, List, Mapping, Optional, Tuple

import torch

from megatron.checkpoint import manifest
from megatron.checkpoint.torch_files import load_file
from megatron.errors import InputError

Section = Callable[[object], Mapping[Hashable, torch.Tensor]]  # a file's contents -> the tensors read from it, by name


class TensorRecords:
    """The zip-format torch file `path`: its contents, tensors on the meta device (`contents`), and read(), which
    gives some of those tensors' values from the file."""

    def __init__(self, path: str):
        self.path = path
        self.contents = load_file(path, meta=True)
        with zipfile.ZipFile(path) as archive:  # torch records the byte order of the machine that wrote it
            order = [name for name in archive.namelist() if name.endswith("/byteorder")]
            self._swap = bool(order) and archive.read(order[0]).decode() != sys.byteorder

    def read(self, metas: Mapping[Hashable, torch.Tensor]) -> Dict[Hashable, torch.Tensor]:
        """The values of `metas` (tensors of `contents`, by name), as torch.load's memory map gives them: views of
        one map of the file made for this call, which closes when they are dropped (requiring gradients where the
        file says so: DeepSpeed saves its fp32 partitions so, and a copy saved again keeps that)."""
        size = os.path.getsize(self.path)
        mapped = torch.UntypedStorage.from_file(self.path, False, size)
        storages: Dict[int, torch.UntypedStorage] = {}  # by offset in the file: one storage for tensors sharing it
        result = {}
        for name, meta in metas.items():
            storage = meta.untyped_storage()
            start, end = storage._checkpoint_offset, storage._checkpoint_offset + storage.nbytes()
            if start not in storages:
                if end > size:
                    raise InputError(f"{self.path} ends inside a tensor's data: the file is truncated; copy it again "
                                     "or use another checkpoint")
                storages[start] = mapped[start:end]
                if self._swap:
                    storages[start].byteswap(meta.dtype)
            result[name] = torch.empty(0, dtype=meta.dtype).set_(storages[start], meta.storage_offset(), meta.shape,
                                                                 meta.stride()).requires_grad_(meta.requires_grad)
        return result


class FileSections:
    """One section (`section` of the contents) of each file of `paths`, tensors taken a few at a time. Each file
    is parsed once, when first asked for, and kept parsed (tensors on the meta device) for every later take: a
    reader that serves one piece and one kind at a time then never parses a file again."""

    def __init__(self, paths: Mapping[Hashable, str], section: Section):
        self._paths, self._section = dict(paths), section
        self._parsed: Dict[Hashable, Optional[Tuple[TensorRecords, Mapping]]] = {}  # None: read whole at each take

    def _records(self, key: Hashable) -> Optional[Tuple[TensorRecords, Mapping]]:
        """File `key` parsed, with its section (None: it is read whole at each take)."""
        if key not in self._parsed:
            parsed = None
            if manifest.is_zip_archive(self._paths[key]):
                records = TensorRecords(self._paths[key])
                section = self._section(records.contents)
                if all(hasattr(tensor.untyped_storage(), "_checkpoint_offset") for tensor in section.values()):
                    parsed = records, section  # else a torch that does not mark offsets: read whole, as legacy
            self._parsed[key] = parsed
        return self._parsed[key]

    def paths(self) -> List[str]:
        return list(self._paths.values())

    def contents(self, key: Hashable) -> object:
        """File `key`'s contents for what is not a tensor's value (names, shapes, counts): as parsed, tensors on
        the meta device (a legacy-format file is loaded whole)."""
        parsed = self._records(key)
        return parsed[0].contents if parsed is not None else load_file(self._paths[key])

    def names(self, key: Hashable) -> List[Hashable]:
        """The names in file `key`'s section."""
        parsed = self._records(key)
        return list(parsed[1] if parsed is not None else self._section(load_file(self._paths[key])))

    def take(self, key: Hashable, names: Iterable[Hashable]) -> Dict[Hashable, torch.Tensor]:
        """The tensors `names` of file `key`'s section."""
        parsed = self._records(key)
        section = parsed[1] if parsed is not None else self._section(load_file(self._paths[key]))
        return self.read(key, {name: section[name] for name in names})

    def read(self, key: Hashable, tensors: Mapping[Hashable, torch.Tensor]) -> Dict[Hashable, torch.Tensor]:
        """The values of `tensors`, tensors of contents(key) or views of them (a legacy-format file's are
        values already)."""
        parsed = self._records(key)
        return dict(tensors) if parsed is None else parsed[0].read(tensors)

    def scalar(self, key: Hashable, value: object) -> object:
        """`value` of contents(key): a number as it is, a one-element tensor's number read from the file."""
        return self.read(key, {0: value})[0].item() if isinstance(value, torch.Tensor) else value
