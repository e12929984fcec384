"""Read a checkpoint of any layout a user brings into the single-process GPTModel's weights, in one CPU process (no
torch.distributed): detect.weights_kind says which kind of source it is (detect.py lists them), WEIGHT_UNITS holds
the unit builder of each kind (one module per format: pipeline_engine, plain_engine and its MoE expert files,
megatron, universal, zero3), and read_checkpoint reads the units the kind calls for. Tensor-parallel shards are joined (shards.shard_from_shards) into full tensors, or
cut straight into one target rank's shards (weight_units.TensorShard) reading only the files and ranges it
overlaps; the result is keyed by the single-process GPTModel's parameter names, the tied word embedding once.
"""
from dataclasses import replace
from types import MappingProxyType
from typing import Optional

from megatron.checkpoint.client_state import is_current, recorded_consumed_samples
from megatron.checkpoint.file_names import ARGS, ITERATION
from megatron.checkpoint.formats import megatron, pipeline_engine, plain_engine, universal, zero3
from megatron.checkpoint.formats.checkpoint import Checkpoint
from megatron.checkpoint.formats.detect import (MEGATRON, PIPELINE, PIPELINE_FROM_ZERO, PLAIN, UNIVERSAL_FILES,
                                                ZERO3, gate_up_rows, holds_optimizer_state, layout_of,
                                                read_client_state, weights_kind)
from megatron.checkpoint.formats.locate import checkpoint_directory
from megatron.checkpoint.formats.weight_units import WHOLE, Progress, StreamedWeights, TensorShard, quiet, read_whole
from megatron.config.recorded_flags import RecordedFlags

# The weights of each kind of checkpoint (detect.weights_kind), as units: each format module's
# units(tag_dir, layout, flags, kind, part).
WEIGHT_UNITS = MappingProxyType({
    MEGATRON: megatron.units,
    UNIVERSAL_FILES: universal.units,
    PIPELINE: pipeline_engine.units,
    PIPELINE_FROM_ZERO: pipeline_engine.units,
    ZERO3: zero3.units,
    PLAIN: plain_engine.units,
})


def read_checkpoint(load_dir: str, iteration: Optional[int] = None, progress: Progress = quiet,
                    universal: bool = False, part: TensorShard = WHOLE, streamed: bool = False,
                    optimizer: bool = True) -> Checkpoint:
    """The checkpoint in `load_dir` (its newest, or that of `iteration`; with `universal` the one
    `latest_universal` names) with the full model weights, or with `part`'s shard of each (its padded
    vocabulary size is still the whole model's). With `streamed`, the weights are read when asked for
    (StreamedWeights), for a caller that uses one tensor at a time. Without `optimizer` (a reader of the weights
    alone) the optimizer-state files may be missing."""
    tag_dir = checkpoint_directory(load_dir, iteration, universal)
    # the client state is not kept: the weights are read again, unit by unit
    state = read_client_state(tag_dir, whole=part == WHOLE, optimizer=optimizer)
    layout, flags = layout_of(state, tag_dir), RecordedFlags.of(state[ARGS])
    kind = weights_kind(tag_dir, state, layout)
    part = replace(part, gate_up=gate_up_rows(tag_dir, state))
    units = WEIGHT_UNITS[kind](tag_dir, layout, flags, kind, part)
    model = StreamedWeights(units) if streamed else read_whole(units, progress)
    padded_vocab_size = model["embedding.word_embeddings.weight"].shape[0] * part.size  # rows are split
    return Checkpoint(directory=tag_dir, iteration=int(state[ITERATION]),
                      consumed_train_samples=recorded_consumed_samples(state), args=flags.recorded,
                      layout=layout, padded_vocab_size=padded_vocab_size, model=MappingProxyType(model),
                      has_optimizer_state=holds_optimizer_state(tag_dir, state), old=not is_current(state),
                      gate_up=part.gate_up)
