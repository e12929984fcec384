"""The model flags' argparse lines agree with their one declaration, config/model_config.ModelConfig: every field
is a flag, a command line without it gets the field's default, and the required ones are required. --window-size as
Megatron-LM spells it (LEFT,RIGHT; megatron/training/arguments.py's tuple of two ints) read into the model's
window_size; what a causal model cannot mean is one line (the flag reaching the built model:
tests/config/test_model_config.py)."""
import argparse
import dataclasses

import pytest

from megatron.config.arguments import flag_defaults
from megatron.config.flags import model
from megatron.config.flags.model import window_size
from megatron.config.model_config import DEFAULTS, ModelConfig
from megatron.errors import InputError


def test_every_model_field_is_a_flag_with_the_declared_default():
    defaults = flag_defaults()
    for spec in dataclasses.fields(ModelConfig):
        assert spec.name in defaults, f"ModelConfig.{spec.name} has no flag"
        if spec.name in DEFAULTS:
            assert defaults[spec.name] == DEFAULTS[spec.name], spec.name


def test_fields_without_a_default_are_required_or_derived_from_one():
    required = {spec.name for spec in dataclasses.fields(ModelConfig) if spec.name not in DEFAULTS}
    assert required - set(model.LIMITS.required) == {"max_position_embeddings"}  # --seq-length's by default
    assert model.shape({**flag_defaults(), "hidden_size": 8, "num_attention_heads": 2, "seq_length": 16,
                        "tensor_model_parallel_size": 1})["max_position_embeddings"] == 16


def test_preset_defaults_are_the_declared_ones():
    assert model.PRESET_DEFAULTS == {name: DEFAULTS[name] for name in model.PRESET_DEFAULTS}
    parser = argparse.ArgumentParser()
    model.add_flags(parser)
    parsed = vars(parser.parse_args([]))
    assert all(parsed[name] is None for name in model.PRESET_DEFAULTS)  # so a preset can fill them


def test_window_size_left_right_and_left_alone():
    assert (window_size("4095,0"), window_size("7"), window_size("0,0"), window_size(31)) == (4095, 7, 0, 31)
    assert window_size("-1,0") is None and window_size(None) is None  # Megatron-LM's -1: no limit


@pytest.mark.parametrize("flag, message", [
    ("4095,1", "only causal windows are supported"), ("-2,0", "only causal windows are supported"),
    ("4k", "is not LEFT,RIGHT"), ("1,0,0", "is not LEFT,RIGHT")])
def test_what_a_causal_model_cannot_mean_is_one_line(flag, message):
    with pytest.raises(InputError, match=f"^--window-size .*{message}") as caught:
        window_size(flag)
    assert "\n" not in str(caught.value)
