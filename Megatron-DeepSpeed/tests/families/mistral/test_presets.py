"""Mistral's presets: the parameter count of the built model, the planner's and the FLOPs count's layer agree,
Mistral-7B-v0.3's equals the published one, and mistral-tiny's window is inside its sequence."""
import pytest
import torch

from megatron.config.model_config import ModelConfig
from megatron.config.presets import get_preset
from megatron.model.gpt import GPTModel
from megatron.model.gpt_config import gpt_config
from megatron.planning.shape import shape_from_preset, stage_parameters
from megatron.training.flops import LayerMatrices

MISTRAL_VOCAB = 32768  # v0.3's
PUBLISHED = {"mistral-7B": 7_248_023_552}  # Mistral-7B-v0.3's safetensors


@pytest.mark.parametrize("name", ["mistral-7B", "mistral-tiny"])
def test_built_model_planner_and_flops_agree(name):
    preset = get_preset(name)
    model = ModelConfig.from_flags({**preset, "max_position_embeddings": preset["seq_length"]})
    with torch.device("meta"):
        built = GPTModel(gpt_config(model, padded_vocab_size=MISTRAL_VOCAB))
    count = sum(parameter.numel() for parameter in built.parameters())
    assert count == PUBLISHED.get(name, count)
    assert not any(name.endswith("bias") for name, _ in built.named_parameters())
    shape, _ = shape_from_preset(name, vocab_size=MISTRAL_VOCAB)
    assert stage_parameters(shape, 1, 1, 0, pipeline_engine=False) == count
    layer = LayerMatrices.of(model)
    assert layer.attention + layer.mlp == sum(p.numel() for p in built.layers[0].parameters() if p.dim() == 2)


def test_the_tiny_presets_window_is_inside_its_sequence():
    preset = get_preset("mistral-tiny")
    assert preset["window_size"] + 1 < preset["seq_length"]
    assert get_preset("mistral-7B")["window_size"] is None
