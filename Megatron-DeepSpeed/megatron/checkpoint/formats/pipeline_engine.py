"""DeepSpeed's pipeline engine: one file per spec position (model/pipe.py) and tensor-parallel rank,
layer_{NN}-model_{tp:02d}-model_states.pt, numbered as upstream's or, in earlier versions of this project, from 0
(detect.PIPELINE, detect.PIPELINE_FROM_ZERO); the weights as units, and which parameters each pipeline stage's
optimizer holds, in order."""
import os
from typing import Dict, List

from megatron.checkpoint.file_names import layer_file
from megatron.checkpoint.formats.checkpoint import Checkpoint
from megatron.checkpoint.formats.detect import PIPELINE, PIPELINE_FROM_ZERO, Layout, pipeline_positions
from megatron.checkpoint.formats.weight_units import TensorShard, Units, assembled
from megatron.checkpoint.parameter_names import OLD_TIED_PREFIX, TIED_PREFIX, name_at_position, old_position_name
from megatron.config.recorded_flags import RecordedFlags
from megatron.checkpoint.torch_files import load_file
from megatron.model.pipe import EMBEDDING_SPEC, final_norm_spec, layer_spec


def _piece_weights(tag_dir: str, layout: Layout, num_layers: int, old: bool, position: int,
                   part: TensorShard) -> dict:
    """`part` of each tensor of the piece at spec `position`, under GPTModel's names."""
    shards = {tp: load_file(os.path.join(tag_dir, layer_file(position, tp))) for tp in part.sources(layout.tensor)}
    names = {key: _piece_name(old, position, key, num_layers) for key in shards[min(shards)]}
    return {name: assembled(part, shards, layout.tensor, key, name) for key, name in names.items()}


def _piece_name(old: bool, position: int, key: str, num_layers: int) -> str:
    return (old_position_name if old else name_at_position)(position, key, num_layers)


def units(tag_dir: str, layout: Layout, flags: RecordedFlags, kind: str, part: TensorShard) -> Units:
    """The layer files: numbered as upstream's (model/pipe.py), or as earlier versions of this project numbered
    them (embedding layer_00); a piece's keys are read from the pickle, not its tensors."""
    old, positions, num_layers = kind == PIPELINE_FROM_ZERO, pipeline_positions(kind, flags), flags.num_layers
    source = part.sources(layout.tensor)[0]
    of = {_piece_name(old, position, key, num_layers): position for position in positions
          for key in load_file(os.path.join(tag_dir, layer_file(position, source)))}
    return Units(of, lambda position: _piece_weights(tag_dir, layout, num_layers, old, position, part))


def pipeline_stage_pieces(num_layers: int, stages: int, old: bool = False) -> List[range]:
    """The spec positions (DeepSpeed layer numbers) each pipeline stage holds, as GPTPipe partitions them:
    balanced over transformer layers (model/pipe.py's partition_method). `old`: as earlier versions of this
    project built the pipeline (embedding 0, layers 1..L, final LayerNorm, LM head)."""
    from deepspeed.runtime.utils import partition_balanced

    first, specs = (1, num_layers + 3) if old else (layer_spec(0), final_norm_spec(num_layers) + 2)
    weights = [1 if first <= spec < first + num_layers else 0 for spec in range(specs)]
    parts = partition_balanced(weights=weights, num_parts=stages)
    return [range(parts[stage], parts[stage + 1]) for stage in range(stages)]


def stage_parameters(checkpoint: Checkpoint, stage: int, tp_rank: int,
                               read: Dict[tuple, List[tuple]]) -> List[tuple]:
    """(stage name, shape) of one pipeline stage's parameters in module order: the tied embedding first (on the
    first and last stage), then each piece's. `read`: (piece, tensor-parallel rank) -> its (key, shape), for
    the layer files already read (the embedding's serves two stages)."""
    flags, old = checkpoint.flags, checkpoint.old
    stage_pieces = pipeline_stage_pieces(flags.num_layers, checkpoint.layout.pipeline, old)
    # the last piece is the output layer, not the tied embedding
    tied_piece = None if flags.untied else stage_pieces[-1][-1]
    embedding_piece = 0 if old else EMBEDDING_SPEC
    with_parameters = pipeline_positions(PIPELINE_FROM_ZERO if old else PIPELINE, flags)

    def keys_and_shapes(piece: int) -> List[tuple]:
        if (piece, tp_rank) not in read:
            layer = load_file(os.path.join(checkpoint.directory, layer_file(piece, tp_rank)))
            read[piece, tp_rank] = [(key, tensor.shape) for key, tensor in layer.items()]
        return read[piece, tp_rank]
    parameters = []
    if embedding_piece in stage_pieces[stage] or tied_piece in stage_pieces[stage]:
        parameters += [((OLD_TIED_PREFIX if old else TIED_PREFIX) + key, shape)
                       for key, shape in keys_and_shapes(embedding_piece)]
    for piece in stage_pieces[stage]:
        if piece not in (embedding_piece, tied_piece) and piece in with_parameters:
            parameters += [(f"{piece}.{key}", shape) for key, shape in keys_and_shapes(piece)]
    return parameters
