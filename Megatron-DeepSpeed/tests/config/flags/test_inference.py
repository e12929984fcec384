"""Flags of generation and evaluation (megatron/config/flags/inference.py): a checkpoint is required, layouts
default to 1, the tokenizer to what the model was trained with, the model-shape flags are optional, and a
pipeline split or an empty micro-batch is one line."""
import pytest

from megatron.config.flags import inference
from tests.helpers.flag_groups import parsed_alone, refusal


def test_defaults():
    values = parsed_alone(inference, "--load", "ckpt")
    assert values["model_shape_flags"] == inference.MODEL_SHAPE_FLAGS
    assert (values["tensor_model_parallel_size"], values["pipeline_model_parallel_size"]) == (1, 1)
    assert (values["micro_batch_size"], values["tokenizer_type"], values["num_layers"]) == (8, None, None)
    assert not (values["fp16"] or values["bf16"]) and values["trust_checkpoint"] is None


def test_a_tool_with_its_own_seq_length_leaves_that_flag_out():
    values = parsed_alone(inference, "--load", "ckpt", seq_length_flag=False)
    assert "seq_length" not in values and values["model_shape_flags"] == inference.MODEL_SHAPE_FLAGS[:-1]


def test_load_is_required_and_dtypes_exclude_each_other():
    assert "the following arguments are required: --load" in refusal(parsed_alone, inference)
    assert "argument --bf16: not allowed with argument --fp16" in refusal(parsed_alone, inference, "--load", "c",
                                                                          "--fp16", "--bf16")


@pytest.mark.parametrize("argv, message", [
    (["--pipeline-model-parallel-size", "2"], "--pipeline-model-parallel-size 2: generation and evaluation run every "
                                              "layer in each tensor-parallel group; drop the flag"),
    (["--micro-batch-size", "0"], "--micro-batch-size 0 must be at least 1"),
])
def test_refusals(argv, message):
    assert refusal(inference.validate, parsed_alone(inference, "--load", "ckpt", *argv)).startswith(message)
