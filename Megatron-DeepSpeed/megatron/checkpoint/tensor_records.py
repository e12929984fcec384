"""A few tensors at a time from torch files that hold many: the plain engine's model-states files and Megatron's
rank files hold every model piece, and a converter takes one piece at a time. Loading such a file again for each
piece unpickled all of it each time (most of a conversion's time), and a memory map kept open across pieces would
leave every page read counted in the process's memory. So a zip-format file's pickle is read once, its tensors on
the meta device, where torch notes each storage's offset in the file, and each take maps the file anew and views
the tensors taken there (as torch.load's memory map would), the map closing when they are dropped. A file in
torch's legacy format cannot be read in parts; it is loaded whole at each take, and so is every file where the
torch in use does not mark the offsets (`_checkpoint_offset`, set by torch.load for the meta device since 2.x)."""
import os
import sys
import zipfile
from typing import Callable, Dict, Hashable, Iterable, List, Mapping

import torch

from megatron.checkpoint import manifest
from megatron.checkpoint.directory import load_file
from megatron.errors import InputError

Section = Callable[[object], Mapping[str, torch.Tensor]]  # a file's contents -> the tensors read from it, by name


class TensorRecords:
    """The zip-format torch file `path`: its contents, tensors on the meta device (`contents`), and read(), which
    gives some of those tensors' values from the file."""

    def __init__(self, path: str):
        self.path = path
        self.contents = load_file(path, meta=True)
        with zipfile.ZipFile(path) as archive:  # torch records the byte order of the machine that wrote it
            order = [name for name in archive.namelist() if name.endswith("/byteorder")]
            self._swap = bool(order) and archive.read(order[0]).decode() != sys.byteorder

    def read(self, metas: Mapping[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """The values of `metas` (tensors of `contents`, by name), as torch.load's memory map gives them: views of
        one map of the file made for this call, which closes when they are dropped."""
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
                                                                 meta.stride())
        return result


class FileSections:
    """One section (`section` of the contents) of each file of `paths`, tensors taken a few at a time."""

    def __init__(self, paths: Mapping[Hashable, str], section: Section):
        self._paths, self._section = dict(paths), section
        in_parts = all(manifest.is_zip_archive(path) for path in self._paths.values())
        self._records = {key: TensorRecords(path) for key, path in self._paths.items()} if in_parts else {}
        self._sections = {key: section(records.contents) for key, records in self._records.items()}
        if not all(hasattr(tensor.untyped_storage(), "_checkpoint_offset")
                   for tensors in self._sections.values() for tensor in tensors.values()):
            self._records, self._sections = {}, {}  # a torch that does not mark offsets: whole files, as legacy ones

    def names(self, key: Hashable) -> List[str]:
        """The names in file `key`'s section (a legacy-format file is loaded for them)."""
        return list(self._sections[key] if self._records else self._section(load_file(self._paths[key])))

    def take(self, key: Hashable, names: Iterable[str]) -> Dict[str, torch.Tensor]:
        """The tensors `names` of file `key`'s section."""
        if not self._records:
            section = self._section(load_file(self._paths[key]))
            return {name: section[name] for name in names}
        return self._records[key].read({name: self._sections[key][name] for name in names})
