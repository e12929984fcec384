"""Qwen2's presets: the parameter count of the built model, the planner's and the FLOPs count's layer agree, and
Qwen2.5-0.5B's equals the published one."""
import pytest

from tests.helpers.family_presets import built_preset_counted

QWEN_VOCAB = 151936
PUBLISHED = {"qwen2.5-0.5B": 494_032_768}  # Qwen2.5-0.5B's safetensors, tied output layer


@pytest.mark.parametrize("name", ["qwen2.5-0.5B", "qwen2.5-7B", "qwen2-tiny"])
def test_built_model_planner_and_flops_agree(name):
    built, count = built_preset_counted(name, QWEN_VOCAB)
    assert count == PUBLISHED.get(name, count)
    biases = {name for name, _ in built.named_parameters() if name.endswith("bias")}
    assert biases == {f"layers.{i}.self_attention.query_key_value.bias" for i in range(len(built.layers))}
