"""Qwen3's presets: the parameter count of the built model, the planner's and the FLOPs count's layer agree, and
Qwen3-0.6B's and Qwen3-8B's equal the published ones."""
import pytest
import torch

from megatron.config.model_config import ModelConfig
from megatron.config.presets import get_preset
from megatron.model.gpt import GPTModel
from megatron.model.gpt_config import gpt_config
from megatron.planning.shape import shape_from_preset, stage_parameters
from megatron.training.flops import LayerMatrices

QWEN_VOCAB = 151936
PUBLISHED = {"qwen3-0.6B": 596_049_920, "qwen3-8B": 8_190_735_360}  # their safetensors


@pytest.mark.parametrize("name", ["qwen3-0.6B", "qwen3-8B", "qwen3-tiny"])
def test_built_model_planner_and_flops_agree(name):
    preset = get_preset(name)
    model = ModelConfig.from_flags({**preset, "max_position_embeddings": preset["seq_length"]})
    with torch.device("meta"):
        built = GPTModel(gpt_config(model, padded_vocab_size=QWEN_VOCAB))
    count = sum(parameter.numel() for parameter in built.parameters())
    assert count == PUBLISHED.get(name, count)
    assert not any(name.endswith("bias") for name, _ in built.named_parameters())
    shape, _ = shape_from_preset(name, vocab_size=QWEN_VOCAB)
    assert stage_parameters(shape, 1, 1, 0, pipeline_engine=False) == count
    layer = LayerMatrices.of(model)
    assert layer.attention + layer.mlp == sum(p.numel() for p in built.layers[0].parameters() if p.dim() == 2)
