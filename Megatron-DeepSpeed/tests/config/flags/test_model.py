"""Model flags (megatron/config/flags/model.py): upstream's aliases, the shape's defaults (MLP width, position
table, key/value heads) and their checks against each other and tensor parallelism, the numerics refusals, and the
ModelConfig; every ModelConfig field a flag with its declared default; --window-size in Megatron-LM's LEFT,RIGHT
spelling."""
import argparse
import dataclasses

import pytest

from megatron.config.arguments import flag_defaults
from megatron.config.flags import model
from megatron.config.flags.model import window_size
from megatron.config.model_config import DEFAULTS, ModelConfig
from megatron.errors import InputError
from tests.helpers.flag_groups import parsed_alone, refusal, resolved


def test_defaults_are_left_to_the_preset():
    values = parsed_alone(model)
    assert values["model_size"] is None and values["num_layers"] is None
    assert all(values[dest] is None for dest in model.PRESET_DEFAULTS)


def test_encoder_seq_length_is_seq_length_and_the_interpolation_factor_is_linear_scaling():
    values = parsed_alone(model, "--encoder-seq-length", "64", "--rotary-seq-len-interpolation-factor", "4")
    assert model.after_parse(values) == {"seq_length": 64, "rope_scaling_type": "linear", "rope_scaling_factor": 4.0}
    assert model.after_parse(parsed_alone(model)) == {}


@pytest.mark.parametrize("argv, message", [
    (["--seq-length", "32", "--encoder-seq-length", "64"], "--seq-length 32 and --encoder-seq-length 64 name the "
                                                           "same length; give one of them"),
    (["--rotary-seq-len-interpolation-factor", "4", "--rope-scaling-type", "yarn"],
     "--rotary-seq-len-interpolation-factor 4 is the linear rotary scaling; it cannot go with --rope-scaling-type "
     "yarn --rope-scaling-factor None: give one of them"),
])
def test_alias_refusals(argv, message):
    assert refusal(model.after_parse, parsed_alone(model, *argv)) == message


def test_shape_defaults():
    assert model.shape({**resolved(), "ffn_hidden_size": None, "max_position_embeddings": None,
                        "num_key_value_heads": None}) == {
        "ffn_hidden_size": 32, "max_position_embeddings": 16, "num_key_value_heads": 2, "add_position_embedding": True,
        "window_size": None}
    rotary = resolved("--use-rotary-position-embeddings", "--max-position-embeddings", "64")
    assert not rotary["add_position_embedding"] and rotary["max_position_embeddings"] == 64


@pytest.mark.parametrize("changed, message", [
    ({"max_position_embeddings": 8}, "--seq-length 16 is above --max-position-embeddings 8; raise "
                                     "--max-position-embeddings to at least 16 or shorten --seq-length"),
    ({"num_attention_heads": 3}, "--hidden-size 8 is not divisible by --num-attention-heads 3; pick a hidden size "
                                 "that is a multiple of the head count"),
    ({"tensor_model_parallel_size": 4}, "--num-attention-heads 2 is not divisible by --tensor-model-parallel-size 4"),
    ({"num_key_value_heads": 3}, "--num-attention-heads 2 is not divisible by --num-key-value-heads 3"),
    ({"num_key_value_heads": 1, "tensor_model_parallel_size": 2}, "--num-key-value-heads 1 is not divisible by "
                                                                  "--tensor-model-parallel-size 2"),
    ({"rotary_percent": 0.0}, "--rotary-percent 0.0 must be in (0, 1]"),
    ({"rope_scaling_type": "linear", "use_rotary_position_embeddings": False},
     "--rope-scaling-type linear scales rotary position embeddings; add --use-rotary-position-embeddings or drop it"),
])
def test_shape_refusals(changed, message):
    assert refusal(model.shape, {**resolved(), **changed}).startswith(message)


@pytest.mark.parametrize("changed, message", [
    ({"fp32_residual_connection": True}, "--fp32-residual-connection keeps the residual stream in fp32 while the "
                                         "model runs in half precision; add --fp16 or --bf16"),
    ({"layernorm_epsilon": 0.0}, "--layernorm-epsilon 0.0 must be greater than 0, e.g. 1e-5"),
])
def test_numerics_refusals(changed, message):
    assert refusal(model.validate, {**resolved(), **changed}).startswith(message)


def test_section():
    section = model.section(resolved("--swiglu", "--num-key-value-heads", "1"))
    assert isinstance(section, ModelConfig)
    assert (section.num_layers, section.hidden_size, section.num_attention_heads, section.max_position_embeddings,
            section.ffn_hidden_size) == (2, 8, 2, 16, 32)
    assert section.swiglu and section.num_key_value_heads == 1


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
