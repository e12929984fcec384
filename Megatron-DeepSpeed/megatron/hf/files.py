"""A transformers model directory's files, read and written one tensor at a time (the families' adapters,
megatron/families/, map the tensors' names and layouts).

A directory holds config.json and its weights either as one model.safetensors, as shards named by
model.safetensors.index.json ({"weight_map": {tensor name: shard file}}), or as an older pytorch_model.bin. Reading
opens the safetensors files memory-mapped and takes one tensor when asked, so an import holds the tensor it is
converting, never a whole shard; writing fills a shard up to a byte limit, writes it and starts the next, naming
them model-0000i-of-0000n.safetensors as transformers does.
"""
import json
import os
import re
from typing import Dict, Iterable, Mapping, Tuple

import torch

from megatron.checkpoint.torch_files import load_file
from megatron.errors import InputError
from megatron.families.hf_tensors import LazyTensors

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
LEGACY_WEIGHTS_FILE = "pytorch_model.bin"
HF_CONFIG_KEPT = "hf_config_kept"  # checkpoint flag: what an imported config.json said that an export writes back
DEFAULT_SHARD_BYTES = 5 * 10 ** 9  # transformers' save_pretrained default ("5GB")
_SIZE = re.compile(r"^\s*(\d+)\s*(|B|KB|MB|GB|TB)\s*$", re.IGNORECASE)


def read_config_json(directory: str) -> dict:
    """config.json of a Hugging Face model directory, or an InputError naming what is missing."""
    path = os.path.join(directory, CONFIG_FILE)
    if not os.path.isdir(directory):
        raise InputError(f"Hugging Face model directory {directory} does not exist")
    if not os.path.isfile(path):
        raise InputError(f"{directory} has no {CONFIG_FILE}: it is not a Hugging Face model directory")
    try:
        with open(path, encoding="utf-8") as handle:
            config = json.load(handle)
    except (OSError, ValueError) as err:
        raise InputError(f"{path} cannot be read as JSON ({err})") from err
    if not isinstance(config, dict):
        raise InputError(f"{path} holds {type(config).__name__}, not a JSON object")
    return config


def parse_shard_size(text: str) -> int:
    """Bytes of a size written as transformers' max_shard_size is ('500MB', '5GB', '1000'; decimal units)."""
    match = _SIZE.match(str(text))
    if not match or int(match.group(1)) < 1:
        raise InputError(f"--max-shard-size {text!r} is not a size; write e.g. 5GB, 500MB or a byte count")
    units = {"": 1, "b": 1, "kb": 10 ** 3, "mb": 10 ** 6, "gb": 10 ** 9, "tb": 10 ** 12}
    return int(match.group(1)) * units[match.group(2).lower()]


class SafetensorsWeights(LazyTensors):
    """Tensor name -> tensor over one or more safetensors files, each tensor read when asked (memory-mapped)."""

    def __init__(self, directory: str, file_of: Mapping[str, str]):
        super().__init__(file_of)
        self._directory, self._file_of = directory, dict(file_of)
        self._open: Dict[str, object] = {}

    def _handle(self, file: str):
        if file not in self._open:
            from safetensors import safe_open
            path = os.path.join(self._directory, file)
            try:
                self._open[file] = safe_open(path, framework="pt")
            except Exception as err:  # safetensors raises its own types for missing and damaged files
                raise InputError(f"{path} cannot be read ({type(err).__name__}: {err}); the file is missing, "
                                 "truncated or damaged") from err
        return self._open[file]

    def shape(self, name: str) -> Tuple[int, ...]:
        """The tensor's shape from its file's header, without reading the tensor."""
        return tuple(self._handle(self._file_of[name]).get_slice(name).get_shape())

    def __getitem__(self, name: str) -> torch.Tensor:
        file = self._file_of[name]
        try:
            return self._handle(file).get_tensor(name)
        except InputError:
            raise
        except Exception as err:
            raise InputError(f"tensor '{name}' of {os.path.join(self._directory, file)} cannot be read "
                             f"({type(err).__name__}: {err}); the file is truncated or damaged") from err


def _single_file_names(directory: str) -> Dict[str, str]:
    from safetensors import safe_open
    path = os.path.join(directory, WEIGHTS_FILE)
    try:
        with safe_open(path, framework="pt") as handle:
            return {name: WEIGHTS_FILE for name in handle.keys()}
    except Exception as err:
        raise InputError(f"{path} cannot be read ({type(err).__name__}: {err}); the file is truncated or "
                         "damaged") from err


def _index_names(directory: str) -> Dict[str, str]:
    path = os.path.join(directory, INDEX_FILE)
    try:
        with open(path, encoding="utf-8") as handle:
            weight_map = json.load(handle)["weight_map"]
        if not isinstance(weight_map, dict):
            raise ValueError("weight_map is not an object")
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise InputError(f"{path} is not a safetensors index ({type(err).__name__}: {err}); it must hold "
                         "{\"weight_map\": {tensor name: shard file}}") from err
    file_of = {str(name): str(file) for name, file in weight_map.items()}
    inside = os.path.realpath(directory) + os.sep
    for file in set(file_of.values()):
        shard = os.path.join(directory, file)
        if not os.path.realpath(shard).startswith(inside):
            raise InputError(f"{path} names the shard {file!r}, which is outside {directory}; an index names files "
                             "of its own directory only")
        if os.path.lexists(shard) and not os.path.isfile(shard):  # a FIFO would block the import forever
            raise InputError(f"{shard}, a shard {path} names, is not a regular file (a directory, FIFO, socket or "
                             "device); replace it with the safetensors file")
    return file_of


def open_weights(directory: str) -> Mapping[str, torch.Tensor]:
    """The tensors of a Hugging Face directory by name: sharded or single-file safetensors, read one tensor at a
    time, or the older pytorch_model.bin (through the one torch.load, checkpoint/torch_files.py)."""
    if os.path.isfile(os.path.join(directory, INDEX_FILE)):
        return SafetensorsWeights(directory, _index_names(directory))
    if os.path.isfile(os.path.join(directory, WEIGHTS_FILE)):
        return SafetensorsWeights(directory, _single_file_names(directory))
    legacy = os.path.join(directory, LEGACY_WEIGHTS_FILE)
    if os.path.isfile(legacy):
        return load_file(legacy, mmap=False)  # refuses pickled code as untrusted, a damaged file in one line
    raise InputError(f"{directory} has none of {INDEX_FILE}, {WEIGHTS_FILE}, {LEGACY_WEIGHTS_FILE}: it holds no "
                     "weights to import")


def write_config_json(directory: str, config: Mapping[str, object]) -> None:
    with open(os.path.join(directory, CONFIG_FILE), "w", encoding="utf-8") as handle:
        json.dump(config, handle, indent=2, sort_keys=True)
        handle.write("\n")


def write_weights(directory: str, tensors: Iterable[Tuple[str, torch.Tensor]],
                  max_shard_bytes: int = DEFAULT_SHARD_BYTES) -> Tuple[str, ...]:
    """Write `tensors` (consumed one at a time) as safetensors shards of at most `max_shard_bytes` (a larger tensor
    gets a shard of its own) into an existing (temporary) directory, with model.safetensors.index.json when there
    is more than one shard, as save_pretrained lays them out. Returns the weight files written."""
    from safetensors.torch import save_file

    shards, shard, shard_bytes, total = [], {}, 0, 0

    def flush():
        name = f"shard-{len(shards):05d}.partial"
        save_file(shard, os.path.join(directory, name), metadata={"format": "pt"})
        shards.append((name, list(shard)))

    for name, tensor in tensors:
        size = tensor.numel() * tensor.element_size()
        if shard and shard_bytes + size > max_shard_bytes:
            flush()
            shard, shard_bytes = {}, 0
        shard[name] = tensor.contiguous()
        shard_bytes, total = shard_bytes + size, total + size
    if shard or not shards:
        flush()
    if len(shards) == 1:
        os.replace(os.path.join(directory, shards[0][0]), os.path.join(directory, WEIGHTS_FILE))
        return (WEIGHTS_FILE,)
    weight_map, files = {}, []
    for number, (partial, names) in enumerate(shards, start=1):
        file = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        os.replace(os.path.join(directory, partial), os.path.join(directory, file))
        weight_map.update({name: file for name in names})
        files.append(file)
    with open(os.path.join(directory, INDEX_FILE), "w", encoding="utf-8") as handle:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, handle, indent=2, sort_keys=True)
        handle.write("\n")
    return tuple(files)
