"""Qwen3's presets: the parameter count of the built model, the planner's and the FLOPs count's layer agree, and
Qwen3-0.6B's and Qwen3-8B's equal the published ones."""
import pytest

from megatron.families.qwen3.presets import PRESETS
from tests.helpers.family_presets import built_preset_counted

QWEN_VOCAB = 151936
PUBLISHED = {"qwen3-0.6B": 596_049_920, "qwen3-8B": 8_190_735_360}  # their safetensors


@pytest.mark.parametrize("name", [preset.name for preset in PRESETS])
def test_built_model_planner_and_flops_agree(name):
    built, count = built_preset_counted(name, QWEN_VOCAB)
    assert count == PUBLISHED.get(name, count)
    assert not any(name.endswith("bias") for name, _ in built.named_parameters())
    assert built.layers[0].self_attention.q_norm is not None
