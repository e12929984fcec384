"""DeepSpeed's universal per-parameter files, zero/<engine parameter name>/{fp32,exp_avg,exp_avg_sq,step}.pt: full
tensors (the vocabulary padding stripped), as ds_to_universal writes them (then beside the model-states files
only: detect.UNIVERSAL_FILES, the weights read from fp32.pt) and as convert/target_writer.py writes them beside
the model files (the Adam state of every universal checkpoint read from them)."""
import os
from collections import abc
from typing import Iterator

import torch

from megatron.checkpoint.file_names import MOMENTS, UNIVERSAL_DIR
from megatron.checkpoint.formats.checkpoint import Checkpoint, OptimizerState
from megatron.checkpoint.formats.detect import Layout
from megatron.checkpoint.formats.weight_units import Progress, TensorShard, Units
from megatron.checkpoint.parameter_names import VOCABULARY_ROWS, model_name, stage_name
from megatron.config.recorded_flags import RecordedFlags
from megatron.checkpoint.shards import in_halves
from megatron.checkpoint.tensor_records import FileSections
from megatron.checkpoint.torch_files import load_file


def _universal_units(tag_dir: str, num_layers: int, padded_vocab_size: int, part: TensorShard) -> Units:
    """zero/<engine name>/fp32.pt of a universal checkpoint, the vocabulary padding ds_to_universal strips put
    back (as zeros, as DeepSpeed's loader pads it)."""
    universal = os.path.join(tag_dir, UNIVERSAL_DIR)
    entries = sorted(entry for entry in os.listdir(universal) if os.path.isdir(os.path.join(universal, entry)))
    of = {model_name(entry, num_layers): entry for entry in entries}

    def read(entry: str) -> dict:
        name, tensor = model_name(entry, num_layers), load_file(os.path.join(universal, entry, "fp32.pt"))["param"]
        whole = padded_rows(tensor, padded_vocab_size) if name in VOCABULARY_ROWS else tensor
        return {name: part.assemble(name, {0: whole}, 1)}
    return Units(of, read)


def padded_rows(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    """`tensor` with zero rows appended up to `rows` (a vocabulary whose padding ds_to_universal stripped)."""
    if tensor.dim() == 0 or tensor.shape[0] >= rows:
        return tensor
    return torch.cat([tensor, tensor.new_zeros(rows - tensor.shape[0], *tensor.shape[1:])])


def units(tag_dir: str, _layout: Layout, flags: RecordedFlags, _kind: str, part: TensorShard) -> Units:
    return _universal_units(tag_dir, flags.num_layers, flags.padded_vocab_size, part)


class _UniversalKind(abc.Mapping):
    """One kind of a universal checkpoint's Adam state (fp32, exp_avg or exp_avg_sq) under GPTModel's names,
    each parameter's file parsed once, when first asked for, and its tensor read (memory-mapped) each time it is
    asked for and not kept: a converter writing one file at a time never holds the whole state."""

    def __init__(self, checkpoint: Checkpoint, kind: str):
        self._checkpoint = checkpoint
        self._files = FileSections({name: os.path.join(_universal_folder(checkpoint, name), f"{kind}.pt")
                                    for name in checkpoint.model}, lambda contents: {"param": contents["param"]})

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._checkpoint.model:
            raise KeyError(name)
        tensor = in_halves(name, self._files.take(name, ["param"])["param"], self._checkpoint.gate_up)
        # ds_to_universal strips the vocabulary padding; the other tensors are whole
        return padded_rows(tensor, self._checkpoint.padded_vocab_size) if name in VOCABULARY_ROWS else tensor

    def __iter__(self) -> Iterator[str]:
        return iter(self._checkpoint.model)

    def __len__(self) -> int:
        return len(self._checkpoint.model)


def _universal_folder(checkpoint: Checkpoint, name: str) -> str:
    engine_name = stage_name(name, checkpoint.flags.num_layers) if checkpoint.layout.pipeline_engine else name
    return os.path.join(checkpoint.directory, UNIVERSAL_DIR, engine_name)


def optimizer_state(checkpoint: Checkpoint, progress: Progress) -> OptimizerState:
    names = list(checkpoint.model)
    progress(f"per-parameter optimizer state of {len(names)} parameters: read as each is written")
    step_file = load_file(os.path.join(_universal_folder(checkpoint, names[-1]), "step.pt"))
    step = int(step_file["param"] if isinstance(step_file, dict) else step_file)  # ds_to_universal's: {'param': step}
    return OptimizerState(step=step, param_groups=checkpoint.flags.adam_param_groups,
                          **{kind: _UniversalKind(checkpoint, kind) for kind in ("fp32", *MOMENTS)})
