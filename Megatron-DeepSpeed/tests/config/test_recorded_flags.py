"""recorded_flags.RecordedFlags: a checkpoint's recorded flags read with the flag groups' own defaults for those it
lacks, and the answers the checkpoint code asks of them."""
import numpy
import pytest
import torch

from megatron.config.arguments import flag_defaults
from megatron.config.job import PrecisionConfig
from megatron.config.recorded_flags import RecordedFlags
from megatron.errors import InputError


def test_a_flag_the_checkpoint_lacks_takes_its_flag_groups_default():
    flags = RecordedFlags.of({"num_layers": 2})
    defaults = flag_defaults()
    assert flags.num_layers == 2
    assert flags.clip_grad == defaults["clip_grad"] and flags.seed == defaults["seed"]
    assert flags.make_vocab_size_divisible_by == defaults["make_vocab_size_divisible_by"]
    assert flags.records("num_layers") and not flags.records("seed")
    assert dict(flags.recorded) == {"num_layers": 2}


def test_precision():
    assert (RecordedFlags.of({}).precision, RecordedFlags.of({}).dtype) == ("fp32", torch.float32)
    assert RecordedFlags.of({"bf16": True}).dtype == torch.bfloat16 and RecordedFlags.of({"bf16": True}).bf16
    assert RecordedFlags.of({"fp16": True}).precision == "fp16"


def test_engine_upstreams_record_wins_over_ours():
    assert RecordedFlags.of({}).pipeline_engine
    assert not RecordedFlags.of({"no_pipeline_parallel": True}).pipeline_engine
    assert RecordedFlags.of({"no_pipeline_parallel": True, "ds_pipeline_enabled": True}).pipeline_engine


def test_adam_groups_decayed_then_not():
    decayed, not_decayed = RecordedFlags.of({"lr": 0.5, "weight_decay": 0.1, "adam_beta2": 0.95}).adam_param_groups
    assert decayed == {"lr": 0.5, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
    assert not_decayed == {**decayed, "weight_decay": 0.0}


def test_loss_scaler_static_or_dynamic():
    assert RecordedFlags.of({"loss_scale": 128.0}).loss_scaler == {"dynamic_loss_scale": False, "cur_scale": 128.0}
    assert RecordedFlags.of({"initial_loss_scale": 4096.0}).loss_scaler == {
        "dynamic_loss_scale": True, "cur_scale": 4096.0, "scale_window": flag_defaults()["loss_scale_window"]}


def test_experts():
    dense = RecordedFlags.of({})
    assert not dense.has_experts and dense.whole_model_moe is None and dense.expert_parallel == 1
    moe = RecordedFlags.of({"num_experts": [4], "moe_expert_parallel_size": 2,
                            "enable_expert_tensor_parallelism": True})
    assert moe.has_experts and moe.expert_parallel == 2 and moe.experts_split
    whole = moe.whole_model_moe
    assert whole.expert_parallel_size == 1 and not whole.expert_tensor_parallel


def test_each_flag_is_read_as_the_type_the_job_config_declares():
    flags = RecordedFlags.of({"clip_grad": 1, "num_layers": 2.0, "loss_scale": 128, "tensor_model_parallel_size": 2,
                              "data_parallel_size": numpy.int64(4), "ds_sequence_parallel_size": 2})
    assert type(flags.clip_grad) is float and flags.clip_grad == 1.0
    assert type(flags.num_layers) is int and flags.num_layers == 2
    assert flags.loss_scaler == {"dynamic_loss_scale": False, "cur_scale": 128.0}
    assert type(flags.loss_scaler["cur_scale"]) is float
    assert type(flags.data_parallel) is int and flags.zero_partitions == 8 and flags.model_parallel_ranks == 2
    assert flags.section(PrecisionConfig) == PrecisionConfig(**{
        **{name: flag_defaults()[name] for name in PrecisionConfig.__dataclass_fields__}, "loss_scale": 128.0})


def test_a_recorded_value_of_another_type_is_refused_naming_its_flag():
    with pytest.raises(InputError, match=r"--tensor-model-parallel-size is '2' in the checkpoint's recorded flags; "
                                         r"it must be int"):
        RecordedFlags.of({"tensor_model_parallel_size": "2"}).tensor_parallel
    with pytest.raises(InputError, match=r"--clip-grad is 'x' in the checkpoint's recorded flags; it must be float"):
        RecordedFlags.of({"clip_grad": "x"}).clip_grad
