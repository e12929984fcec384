"""Megatron's layout (upstream's deepspeed_to_megatron.py, Megatron-LM): iter_{N:07d}/mp_rank_{tp:02d}[_{pp:03d}]/
model_optim_rng.pt, the model nested under `model`, each pipeline stage numbering its layers from 0; weights only
(detect.MEGATRON)."""
from typing import Hashable

from megatron.checkpoint.file_names import MEGATRON_MODEL
from megatron.checkpoint.formats.detect import Layout, megatron_rank_file
from megatron.checkpoint.formats.weight_units import TensorShard, Units, all_mappable, assembled, names_in, piece_unit
from megatron.checkpoint.parameter_names import LAYERS_PREFIX, flatten
from megatron.config.recorded_flags import RecordedFlags
from megatron.checkpoint.tensor_records import FileSections


def _megatron_units(tag_dir: str, layout: Layout, num_layers: int, part: TensorShard) -> Units:
    """Each stage's layers numbered from 0 in its file; the stages' layers follow one another."""
    sources = part.sources(layout.tensor)
    paths = {(tp, pp): megatron_rank_file(tag_dir, tp, pp, layout.pipeline)
             for pp in range(layout.pipeline) for tp in sources}
    mappable = all_mappable(paths.values())
    stages = FileSections(paths, lambda contents: flatten(contents[MEGATRON_MODEL]))
    keys, of, first_layer = {}, {}, 0  # GPTModel name -> its key in its stage's files, its unit
    for pp in range(layout.pipeline):
        stage_layers = set()
        for key in stages.names((sources[0], pp)):
            name = key
            if key.startswith(LAYERS_PREFIX):
                _, number, rest = key.split(".", 2)
                stage_layers.add(int(number))
                name = f"{LAYERS_PREFIX}{first_layer + int(number)}.{rest}"
            keys[name], of[name] = key, piece_unit(mappable, pp, name, num_layers)
        first_layer += len(stage_layers)

    def read(unit: Hashable) -> dict:
        names, pp = names_in(of, unit), unit[0]
        shards = {tp: stages.take((tp, pp), [keys[name] for name in names]) for tp in sources}
        return {name: assembled(part, shards, layout.tensor, keys[name], name) for name in names}
    return Units(of, read)


def units(tag_dir: str, layout: Layout, flags: RecordedFlags, _kind: str, part: TensorShard) -> Units:
    return _megatron_units(tag_dir, layout, flags.num_layers, part)
