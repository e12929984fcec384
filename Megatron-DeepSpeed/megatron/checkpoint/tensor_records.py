"""A few tensors at a time from torch files that hold many: the plain engine's model-states files and Megatron's
rank files hold every model piece, and a converter takes one piece at a time. Loading such a file again for each
piece unpickled all of it each time (most of a conversion's time), and a memory map kept open across pieces would
leave every page read counted in the process's memory. So a zip-format file's pickle is read once, its tensors on
the meta device, where torch notes each storage's offset in the file, and a tensor taken is read from there
into memory of its own. A file in torch's legacy format cannot be read in parts; it is loaded whole at each take."""
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
    gives one tensor's values from the file."""

    def __init__(self, path: str):
        self.path = path
        self.contents = load_file(path, meta=True)
        with zipfile.ZipFile(path) as archive:  # torch records the byte order of the machine that wrote it
            order = [name for name in archive.namelist() if name.endswith("/byteorder")]
            self._swap = bool(order) and archive.read(order[0]).decode() != sys.byteorder

    def read(self, meta: torch.Tensor) -> torch.Tensor:
        """The values of `meta` (a tensor of `contents`): its own bytes only, into a tensor of its own when it is
        contiguous; else its whole storage, viewed as it was saved."""
        storage = meta.untyped_storage()
        if meta.is_contiguous():
            tensor = torch.empty(meta.shape, dtype=meta.dtype)
            self._read_into(tensor, storage._checkpoint_offset + meta.storage_offset() * meta.element_size())
            return tensor
        whole = torch.empty(storage.nbytes(), dtype=torch.uint8)
        self._read_into(whole, storage._checkpoint_offset)
        return torch.empty(0, dtype=meta.dtype).set_(whole.untyped_storage(), meta.storage_offset(), meta.shape,
                                                     meta.stride())

    def _read_into(self, tensor: torch.Tensor, offset: int) -> None:
        buffer = memoryview(tensor.reshape(-1).view(torch.uint8).numpy())
        with open(self.path, "rb", buffering=0) as handle:
            handle.seek(offset)
            done = 0
            while done < len(buffer):
                count = handle.readinto(buffer[done:])
                if not count:
                    raise InputError(f"{self.path} ends inside a tensor's data: the file is truncated; copy it again "
                                     "or use another checkpoint")
                done += count
        if self._swap and tensor.element_size() > 1:
            tensor.untyped_storage().byteswap(tensor.dtype)


class FileSections:
    """One section (`section` of the contents) of each file of `paths`, tensors taken a few at a time."""

    def __init__(self, paths: Mapping[Hashable, str], section: Section):
        self._paths, self._section = dict(paths), section
        in_parts = all(manifest.is_zip_archive(path) for path in self._paths.values())
        self._records = {key: TensorRecords(path) for key, path in self._paths.items()} if in_parts else {}
        self._sections = {key: section(records.contents) for key, records in self._records.items()}

    def names(self, key: Hashable) -> List[str]:
        """The names in file `key`'s section (a legacy-format file is loaded for them)."""
        return list(self._sections[key] if self._records else self._section(load_file(self._paths[key])))

    def take(self, key: Hashable, names: Iterable[str]) -> Dict[str, torch.Tensor]:
        """The tensors `names` of file `key`'s section."""
        if not self._records:
            section = self._section(load_file(self._paths[key]))
            return {name: section[name] for name in names}
        return {name: self._records[key].read(self._sections[key][name]) for name in names}
