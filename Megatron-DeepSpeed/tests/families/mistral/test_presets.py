"""Mistral's presets: the parameter count of the built model, the planner's and the FLOPs count's layer agree,
Mistral-7B-v0.3's equals the published one, and mistral-tiny's window is inside its sequence."""
import pytest

from megatron.config.presets import get_preset
from megatron.families.mistral.presets import PRESETS
from tests.helpers.family_presets import built_preset_counted

MISTRAL_VOCAB = 32768  # v0.3's
PUBLISHED = {"mistral-7B": 7_248_023_552}  # Mistral-7B-v0.3's safetensors


@pytest.mark.parametrize("name", [preset.name for preset in PRESETS])
def test_built_model_planner_and_flops_agree(name):
    built, count = built_preset_counted(name, MISTRAL_VOCAB)
    assert count == PUBLISHED.get(name, count)
    assert not any(name.endswith("bias") for name, _ in built.named_parameters())


def test_the_tiny_presets_window_is_inside_its_sequence():
    preset = get_preset("mistral-tiny")
    assert preset["window_size"] + 1 < preset["seq_length"]
    assert get_preset("mistral-7B")["window_size"] is None
