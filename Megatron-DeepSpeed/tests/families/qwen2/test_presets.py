"""Qwen2's presets: the parameter count of the built model, the planner's and the FLOPs count's layer agree, and
Qwen2.5-0.5B's equals the published one."""
import pytest
import torch

from megatron.config.model_config import ModelConfig
from megatron.config.presets import get_preset
from megatron.model.gpt import GPTModel
from megatron.model.gpt_config import gpt_config
from megatron.planning.shape import shape_from_preset, stage_parameters
from megatron.training.flops import LayerMatrices

QWEN_VOCAB = 151936
PUBLISHED = {"qwen2.5-0.5B": 494_032_768}  # Qwen2.5-0.5B's safetensors, tied output layer


@pytest.mark.parametrize("name", ["qwen2.5-0.5B", "qwen2.5-7B", "qwen2-tiny"])
def test_built_model_planner_and_flops_agree(name):
    preset = get_preset(name)
    model = ModelConfig.from_flags({**preset, "max_position_embeddings": preset["seq_length"]})
    with torch.device("meta"):
        built = GPTModel(gpt_config(model, padded_vocab_size=QWEN_VOCAB))
    count = sum(parameter.numel() for parameter in built.parameters())
    assert count == PUBLISHED.get(name, count)
    biases = {name for name, _ in built.named_parameters() if name.endswith("bias")}
    assert biases == {f"layers.{i}.self_attention.query_key_value.bias" for i in range(model.num_layers)}
    shape, _ = shape_from_preset(name, vocab_size=QWEN_VOCAB)
    assert stage_parameters(shape, 1, 1, 0, pipeline_engine=False) == count
    layer = LayerMatrices.of(model)
    assert layer.attention + layer.mlp == sum(p.numel() for p in built.layers[0].parameters() if p.dim() == 2)
