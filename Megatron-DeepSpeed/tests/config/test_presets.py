"""Presets equal docs/ARCHITECTURE.md, Presets, validate on their target world size, and print for shell scripts."""
import json
import os
import subprocess
import sys

import pytest

from megatron.config import presets
from megatron.config.arguments import parse_args, validate_args
from megatron.errors import InputError
from tests.helpers.paths import PACKAGE_ROOT


# Copied by hand from docs/ARCHITECTURE.md, Presets:
#   TP, PP, layers, hidden, heads, seq, micro bs, global bs, lr, min lr
DESIGN_TABLE = {
    "345M": (1, 2, 24, 1024, 16, 1024, 4, 16, 1.5e-4, 1.5e-5),
    "1.3B": (2, 2, 24, 2048, 16, 1024, 8, 32, 2e-4, 2e-5),
    "2.7B": (2, 2, 32, 2560, 32, 2048, 8, 32, 1.6e-4, 1.6e-5),
    "3.7B": (2, 2, 32, 3072, 32, 2048, 4, 16, 1.2e-4, 1.2e-5),
}
COLUMNS = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "num_layers",
           "hidden_size", "num_attention_heads", "seq_length", "micro_batch_size",
           "global_batch_size", "lr", "min_lr")
COMMON = {"checkpoint_activations": True, "lr_decay_style": "cosine", "lr_warmup_fraction": 0.01,
          "split": "949,50,1", "seed": 1234, "hidden_dropout": 0.0, "attention_dropout": 0.0}
MOCK = ["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "1000"]


def test_names():
    assert presets.preset_names() == ("345M", "1.3B", "2.7B", "3.7B", "345M_without_mp", "125M_MoE64", "1.3B_MoE128",
                                      "tiny", "llama2-7B", "llama2-13B", "llama3-8B", "tinyllama-1.1B", "llama-tiny",
                                      "llama3.1-8B", "llama3.2-1B", "llama3.2-3B", "llama3.1-tiny",
                                      "qwen2.5-0.5B", "qwen2.5-7B", "qwen2-tiny", "mistral-7B", "mistral-tiny",
                                      "qwen3-0.6B", "qwen3-8B", "qwen3-tiny")


@pytest.mark.parametrize("name, shape, moe", [
    ("125M_MoE64", (1, 1, 12, 768, 12, 2048, 4, 256, 4.5e-4, 4.5e-6), ([64], 8)),
    ("1.3B_MoE128", (1, 1, 24, 2048, 16, 2048, 8, 512, 1.2e-4, 1.0e-6), ([128], 8)),
])
def test_moe_presets_are_upstreams_moe_examples_on_8_devices(name, shape, moe):
    args = validate_args(parse_args(["--model-size", name, *MOCK]), 8, "cuda")
    assert tuple(getattr(args, column) for column in COLUMNS) == shape
    assert (args.num_experts, args.moe_expert_parallel_size, args.moe_loss_coeff) == (*moe, 0.01)
    assert args.ds_pipeline_enabled is False and args.data_parallel_size == 8


@pytest.mark.parametrize("name", sorted(DESIGN_TABLE))
def test_gpu_presets_match_design(name):
    preset = presets.get_preset(name)
    assert tuple(preset[column] for column in COLUMNS) == DESIGN_TABLE[name]
    assert (preset["train_iters"], preset["lr_decay_iters"]) == (500000, 320000)
    assert preset["no_pipeline_parallel"] is False


def test_345m_without_mp_is_pure_data_parallel():
    preset = presets.get_preset("345M_without_mp")
    assert tuple(preset[column] for column in COLUMNS[:6]) == (1, 1, 24, 1024, 16, 1024)
    assert preset["no_pipeline_parallel"] is True
    assert (preset["train_iters"], preset["lr_decay_iters"]) == (500000, 320000)


def test_tiny_uses_every_parallel_axis_on_8_cpu_processes():
    args = validate_args(parse_args(["--model-size", "tiny", *MOCK]), 8, "cpu")
    assert (args.tensor_model_parallel_size, args.pipeline_model_parallel_size,
            args.data_parallel_size) == (2, 2, 2)
    assert args.num_micro_batches == 2          # 8 / (micro 2 x DP 2)
    assert (args.num_layers, args.hidden_size, args.seq_length) == (4, 64, 128)
    assert (args.train_iters, args.lr_decay_iters) == (300, 300)


@pytest.mark.parametrize("name", presets.preset_names())
def test_common_fields(name):
    preset = presets.get_preset(name)
    assert {key: preset[key] for key in COMMON} == COMMON
    assert preset["num_layers"] % preset["pipeline_model_parallel_size"] == 0


@pytest.mark.parametrize("name", presets.preset_names())
def test_every_preset_validates_on_8_devices(name):
    args = validate_args(parse_args(["--model-size", name, *MOCK]), 8, "cuda")
    preset = presets.get_preset(name)
    assert {key: getattr(args, key) for key in preset} == preset


def test_performance_run_is_300_iterations_of_the_same_schedule():
    full, perf = presets.get_preset("1.3B"), presets.get_preset("1.3B", run="performance")
    assert perf["train_iters"] == 300
    assert {k: v for k, v in perf.items() if k != "train_iters"} == \
        {k: v for k, v in full.items() if k != "train_iters"}


def test_get_preset_returns_a_fresh_dict():
    presets.get_preset("345M")["num_layers"] = 1
    assert presets.get_preset("345M")["num_layers"] == 24


def test_unknown_name_lists_valid_names():
    with pytest.raises(InputError) as caught:
        presets.get_preset("7B")
    assert "'7B'" in str(caught.value)
    assert "345M, 1.3B, 2.7B, 3.7B, 345M_without_mp, 125M_MoE64, 1.3B_MoE128, tiny" in str(caught.value)


def test_unknown_run_kind():
    with pytest.raises(InputError, match="'quick'.*full, performance"):
        presets.get_preset("345M", run="quick")


# ----------------------------------------------------------------------------- CLI

def test_cli_json(capsys):
    presets.main(["2.7B", "--format", "json"])
    assert json.loads(capsys.readouterr().out) == presets.get_preset("2.7B")


def test_cli_flags_round_trip_through_parse_args(capsys):
    presets.main(["345M_without_mp", "--format", "flags", "--run", "performance"])
    out = capsys.readouterr().out
    assert "--no-pipeline-parallel\n" in out and "--train-iters 300\n" in out
    args = parse_args(out.split())
    expected = presets.get_preset("345M_without_mp", run="performance")
    assert {key: getattr(args, key) for key in expected} == expected


def test_cli_flags_leave_out_false_booleans(capsys):
    presets.main(["345M", "--format", "flags"])
    assert "pipeline-parallel\n" not in capsys.readouterr().out


def run_module(*argv):
    return subprocess.run([sys.executable, "-m", "megatron.config.presets", *argv], cwd=PACKAGE_ROOT,
                          capture_output=True, text=True, check=False)


def test_cli_shell_format_evaluates_in_bash():
    script = ('eval "$(\"$PYTHON\" -m megatron.config.presets 345M --run performance)"; '
              'if $CHECKPOINT_ACTIVATIONS && ! $NO_PIPELINE_PARALLEL; then ok=yes; fi; '
              'echo "$NUM_LAYERS $PIPELINE_MODEL_PARALLEL_SIZE $SPLIT $LR $TRAIN_ITERS $ok"')
    result = subprocess.run(["bash", "-c", script], cwd=PACKAGE_ROOT, capture_output=True,
                            text=True, check=True, env={**os.environ, "PYTHON": sys.executable})
    assert result.stdout == "24 2 949,50,1 0.00015 300 yes\n"


def test_cli_unknown_name_exits_2_listing_names():
    result = run_module("7B")
    assert result.returncode == 2
    assert "345M, 1.3B, 2.7B, 3.7B, 345M_without_mp, 125M_MoE64, 1.3B_MoE128, tiny" in result.stderr
    assert "Traceback" not in result.stderr
