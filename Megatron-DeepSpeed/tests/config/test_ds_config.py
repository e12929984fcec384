"""The generated DeepSpeed config follows the flags; a user's JSON may not contradict them."""
import pytest

from megatron.config.arguments import job_config, parse_args, validate_args
from megatron.config.ds_config import (STEPS_PER_PRINT_NEVER, build_deepspeed_config, load_user_config,
                                       merge_with_user_config, resolve_deepspeed_config)
from megatron.errors import InputError

# world 4, TP 1, PP 1 -> DP 4; micro 2 x DP 4 = 8 per step; global 16 -> 2 accumulation steps.
BASE = ["--num-layers", "2", "--hidden-size", "8", "--num-attention-heads", "2",
        "--seq-length", "16", "--micro-batch-size", "2", "--global-batch-size", "16",
        "--lr", "1e-3", "--train-iters", "10", "--mock-data", "--tokenizer-type",
        "NullTokenizer", "--vocab-size", "100"]


def validated(*extra, world_size=4, device="cuda"):
    """The job configuration of BASE + extra flags."""
    return job_config(validate_args(parse_args(BASE + list(extra)), world_size, device))


def test_default_fp32_config():
    assert build_deepspeed_config(validated()) == {
        "train_batch_size": 16,
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 2,
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": 1},
        "fp16": {"enabled": False, "loss_scale": 0, "initial_scale_power": 32,
                 "loss_scale_window": 1000, "hysteresis": 2, "min_loss_scale": 1.0},
        "bf16": {"enabled": False},
        "steps_per_print": STEPS_PER_PRINT_NEVER,
        "wall_clock_breakdown": False,
    }


def test_fp16_dynamic_loss_scale():
    config = build_deepspeed_config(validated("--fp16", "--initial-loss-scale", "65536",
                                              "--loss-scale-window", "500", "--hysteresis", "3",
                                              "--min-loss-scale", "2"))
    assert config["fp16"] == {"enabled": True, "loss_scale": 0, "initial_scale_power": 16,
                              "loss_scale_window": 500, "hysteresis": 3, "min_loss_scale": 2.0}
    assert config["bf16"] == {"enabled": False}


def test_fp16_static_loss_scale():
    config = build_deepspeed_config(validated("--fp16", "--loss-scale", "128"))
    assert config["fp16"]["loss_scale"] == 128.0


def test_bf16():
    config = build_deepspeed_config(validated("--bf16", device="cpu"))
    assert config["bf16"] == {"enabled": True}
    assert config["fp16"]["enabled"] is False


def test_zero_stage_and_cpu_offload():
    config = build_deepspeed_config(validated("--zero-stage", "3", "--no-pipeline-parallel",
                                              "--cpu-optimizer"))
    assert config["zero_optimization"] == {"stage": 3, "offload_optimizer": {"device": "cpu"}}
    # Offloaded state is stepped by torch's AdamW (megatron.training.optimizer), which DeepSpeed must be told to accept.
    assert config["zero_force_ds_cpu_optimizer"] is False


def test_batch_and_clipping_follow_flags():
    config = build_deepspeed_config(validated("--global-batch-size", "48", "--clip-grad", "0.5",
                                              world_size=8))
    assert (config["train_batch_size"], config["train_micro_batch_size_per_gpu"],
            config["gradient_accumulation_steps"], config["gradient_clipping"]) == (48, 2, 3, 0.5)


def test_deepspeed_reads_the_generated_config_as_meant():
    deepspeed_config = pytest.importorskip("deepspeed.runtime.config")
    args = validated("--fp16", "--zero-stage", "2", "--no-pipeline-parallel", "--cpu-optimizer",
                     "--global-batch-size", "6", "--initial-loss-scale", "1024", world_size=1)
    parsed = deepspeed_config.DeepSpeedConfig(build_deepspeed_config(args))
    assert (parsed.train_batch_size, parsed.train_micro_batch_size_per_gpu,
            parsed.gradient_accumulation_steps) == (6, 2, 3)
    assert parsed.zero_optimization_stage == 2
    assert parsed.zero_config.offload_optimizer.device == "cpu"
    assert parsed.zero_force_ds_cpu_optimizer is False
    assert parsed.float16_config.enabled is True
    assert parsed.float16_config.initial_scale_power == 10
    assert parsed.float16_config.loss_scale == 0


# ----------------------------------------------------------------------------- user JSON

def test_user_keys_kept_and_omitted_keys_filled():
    user = {"fp16": {"loss_scale_window": 200}, "zero_optimization": {"reduce_bucket_size": 5e8},
            "train_batch_size": 16, "steps_per_print": 10}
    merged = merge_with_user_config(user, validated(), "ds.json")
    generated = build_deepspeed_config(validated())
    assert merged["steps_per_print"] == 10
    assert merged["fp16"] == {**generated["fp16"], "loss_scale_window": 200}
    assert merged["zero_optimization"] == {"stage": 1, "reduce_bucket_size": 5e8}
    for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                "gradient_clipping", "bf16", "wall_clock_breakdown"):
        assert merged[key] == generated[key]
    assert user == {"fp16": {"loss_scale_window": 200}, "zero_optimization": {"reduce_bucket_size": 5e8},
                    "train_batch_size": 16, "steps_per_print": 10}


@pytest.mark.parametrize("section, flags", [("optimizer", "--adam-beta1"), ("scheduler", "--lr-decay-style")])
def test_sections_the_flags_own_are_refused_not_ignored(section, flags):
    with pytest.raises(InputError, match=f"--deepspeed_config ds.json has an '{section}' section, which would be "
                                         f"ignored: .*{flags}.*; remove the section and set those flags instead"):
        merge_with_user_config({section: {"type": "Adam", "params": {"lr": 0.1}}}, validated(), "ds.json")


def test_agreeing_user_config_passes():
    args = validated("--bf16", "--zero-stage", "2", "--no-pipeline-parallel", "--cpu-optimizer",
                     device="cpu")
    user = build_deepspeed_config(args)
    user["bfloat16"] = user.pop("bf16")
    merged = merge_with_user_config(user, args, "ds.json")
    assert merged["bf16"] == {"enabled": True}
    assert "bfloat16" not in merged


CONTRADICTIONS = [
    ({"train_batch_size": 64}, "train_batch_size=64 but --global-batch-size is 16"),
    ({"train_micro_batch_size_per_gpu": 4},
     "train_micro_batch_size_per_gpu=4 but --micro-batch-size is 2"),
    ({"gradient_accumulation_steps": 4},
     "gradient_accumulation_steps=4 but --global-batch-size 16 / (--micro-batch-size 2 x data "
     "parallel size 4) is 2"),
    ({"gradient_clipping": 0.5}, "gradient_clipping=0.5 but --clip-grad is 1.0"),
    ({"fp16": {"enabled": True}}, "fp16.enabled=true but --fp16 is off"),
    ({"bf16": {"enabled": True}}, "bf16.enabled=true but --bf16 is off"),
    ({"bfloat16": {"enabled": True}}, "bf16.enabled=true but --bf16 is off"),
    ({"zero_optimization": {"stage": 3}}, "zero_optimization.stage=3 but --zero-stage is 1"),
    ({"zero_optimization": {"offload_optimizer": {"device": "cpu"}}},
     'zero_optimization.offload_optimizer.device="cpu" but --cpu-optimizer is off'),
]


@pytest.mark.parametrize("user, expected", CONTRADICTIONS, ids=[e[:24] for _, e in CONTRADICTIONS])
def test_contradictions_name_both_values(user, expected):
    with pytest.raises(InputError) as caught:
        merge_with_user_config(user, validated(), "ds.json")
    assert f"--deepspeed_config ds.json sets {expected}" in str(caught.value)


def test_flags_set_on_contradict_json_set_off():
    args = validated("--fp16", "--cpu-optimizer")
    with pytest.raises(InputError, match="fp16.enabled=false but --fp16 is on"):
        merge_with_user_config({"fp16": {"enabled": False}}, args, "ds.json")
    with pytest.raises(InputError, match='device="none" but --cpu-optimizer is on'):
        merge_with_user_config({"zero_optimization": {"offload_optimizer": {"device": "none"}}},
                               args, "ds.json")


def test_json_forcing_deepspeed_cpu_adam_contradicts_cpu_optimizer():
    args = validated("--zero-stage", "2", "--no-pipeline-parallel", "--cpu-optimizer")
    with pytest.raises(InputError) as caught:
        merge_with_user_config({"zero_force_ds_cpu_optimizer": True}, args, "ds.json")
    assert str(caught.value) == (
        "--deepspeed_config ds.json sets zero_force_ds_cpu_optimizer=true but --cpu-optimizer steps torch's "
        "AdamW on the CPU, not DeepSpeedCPUAdam; make them agree or remove the key from the JSON")
    # Without offload DeepSpeed ignores the key, so any value is fine.
    assert merge_with_user_config({"zero_force_ds_cpu_optimizer": True}, validated(),
                                  "ds.json")["zero_force_ds_cpu_optimizer"] is True


def test_section_that_is_not_an_object():
    with pytest.raises(InputError, match="sets zero_optimization=2, but it must be a JSON object"):
        merge_with_user_config({"zero_optimization": 2}, validated(), "ds.json")


def test_load_reports_file_and_line_of_bad_json(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text('{\n  "train_batch_size": 16,\n  "fp16": {"enabled": tru}\n}\n')
    with pytest.raises(InputError) as caught:
        load_user_config(str(path))
    assert f"{path}:3:" in str(caught.value)
    assert "not valid JSON" in str(caught.value)


def test_load_missing_file(tmp_path):
    with pytest.raises(InputError, match="cannot read it"):
        load_user_config(str(tmp_path / "absent.json"))


def test_load_rejects_non_object(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text("[1, 2]")
    with pytest.raises(InputError, match="top level must be a JSON object"):
        load_user_config(str(path))


def test_resolve_generates_without_a_file():
    args = validated()
    assert resolve_deepspeed_config(args) == build_deepspeed_config(args)


def test_resolve_merges_the_users_file(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text('{"wall_clock_breakdown": true, "zero_optimization": {"stage": 1}}')
    merged = resolve_deepspeed_config(validated("--deepspeed_config", str(path)))
    assert merged["wall_clock_breakdown"] is True
    assert merged["train_batch_size"] == 16


def test_a_misspelled_top_level_key_is_named_with_the_key_meant_unless_allowed(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text('{"zero_optimisation": {"stage": 3}, "wall_clock_breakdown": true}')
    with pytest.raises(InputError, match=r"DeepSpeed does not know the key 'zero_optimisation' and would ignore it; "
                                         r"did you mean 'zero_optimization'\? fix the key, or pass "
                                         r"--allow-unknown-deepspeed-keys"):
        validated("--deepspeed_config", str(path))
    allowed = validated("--deepspeed_config", str(path), "--allow-unknown-deepspeed-keys")
    assert allowed.parallel.zero_stage == 1


def test_every_key_of_upstreams_templates_and_deepspeeds_sections_is_known(tmp_path):
    """Keys DeepSpeed 0.19.8 reads through its submodules' readers, and those of upstream's example JSONs."""
    from megatron.config.deepspeed_keys import known_keys
    assert {"zero_optimization", "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_clipping", "bf16",
            "fp16", "optimizer", "scheduler", "activation_checkpointing", "flops_profiler", "tensorboard", "wandb",
            "csv_monitor", "comms_logger", "aio", "compile", "steps_per_print", "wall_clock_breakdown",
            "zero_allow_untested_optimizer", "prescale_gradients", "data_types", "checkpoint"} <= known_keys()


def test_a_switched_off_section_the_trainer_drops_is_not_an_unknown_key(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text('{"compression_training": {"enabled": false}, "curriculum_learning": {"enabled": false}}')
    assert validated("--deepspeed_config", str(path)).parallel.zero_stage == 1
