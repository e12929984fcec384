"""What the families' preset tests share: a preset built on the meta device, its parameter count checked against
the planner's and the FLOPs count's layer."""
import torch

from megatron.config.model_config import ModelConfig
from megatron.config.presets import get_preset
from megatron.model.gpt import GPTModel
from megatron.model.gpt_config import gpt_config
from megatron.planning.shape import shape_from_preset, stage_parameters
from megatron.training.flops import LayerMatrices


def built_preset_counted(name: str, vocab: int) -> tuple:
    """(the built model, its parameter count) of preset `name` at `vocab` rows, after asserting that the planner
    counts as many and the FLOPs count's layer matrices are the built layer's."""
    preset = get_preset(name)
    model = ModelConfig.from_flags({**preset, "max_position_embeddings": preset["seq_length"]})
    with torch.device("meta"):
        built = GPTModel(gpt_config(model, padded_vocab_size=vocab))
    count = sum(parameter.numel() for parameter in built.parameters())
    shape, _ = shape_from_preset(name, vocab_size=vocab)
    assert stage_parameters(shape, 1, 1, 0, pipeline_engine=False) == count
    layer = LayerMatrices.of(model)
    assert layer.attention + layer.mlp == sum(p.numel() for p in built.layers[0].parameters() if p.dim() == 2)
    return built, count
