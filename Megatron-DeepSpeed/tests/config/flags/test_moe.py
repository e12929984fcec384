"""Mixture-of-experts flags (megatron/config/flags/moe.py): defaults, the checks of the expert counts and of the
parallel layout (only when there are experts), the MoEConfig, and the section of a checkpoint's recorded flags."""
import pytest

from megatron.config.flags import moe
from megatron.config.job import MoEConfig
from tests.helpers.flag_groups import parsed_alone, refusal, resolved


def experts(*argv, **changed) -> dict:
    """A plain-engine run over two data-parallel ranks with 2 experts per MoE layer, changed as given."""
    return {**resolved("--no-pipeline-parallel", "--num-experts", "2", *argv, world_size=2), **changed}


def test_defaults():
    values = parsed_alone(moe)
    assert values["num_experts"] is None and values["moe_loss_coeff"] is None  # PRESET_DEFAULTS apply after
    assert (values["expert_interval"], values["topk"], values["mlp_type"], values["moe_token_dropping"]) == (
        2, 1, "standard", True)


def test_a_layout_with_experts_passes():
    moe.validate(experts("--moe-expert-parallel-size", "2"))


def test_a_dense_run_checks_only_its_counts():
    moe.validate({**resolved(), "use_tutel": True, "moe_train_capacity_factor": 0})


@pytest.mark.parametrize("changed, message", [
    ({"num_experts": [0]}, "--num-experts 0: every count must be at least 1"),
    ({"expert_interval": 0}, "--expert-interval 0 must be at least 1"),
    ({"num_experts": [2, 2, 2]}, "--num-experts has 3 values; give one, or one per MoE layer: --num-layers 2 / "
                                 "--expert-interval 2 = 1"),
    ({"expert_interval": 3}, "--num-experts 2 with --expert-interval 3 above --num-layers 2 leaves no MoE layer"),
    ({"num_experts": [3], "moe_expert_parallel_size": 2}, "--num-experts 3 is not divisible by "
                                                          "--moe-expert-parallel-size 2"),
    ({"moe_expert_parallel_size": 0}, "--moe-expert-parallel-size 0 must be at least 1"),
    ({"ds_pipeline_enabled": True}, "--num-experts above 1 needs DeepSpeed's plain engine"),
    ({"sequence_parallel": True}, "--sequence-parallel with --num-experts above 1"),
    ({"use_tutel": True}, "--use-tutel: Tutel's kernels are not supported by this trainer; drop the flag"),
    ({"zero_stage": 3}, "--zero-stage 3 with --num-experts above 1: DeepSpeed's MoE layer trains under ZeRO stages "
                        "0-2"),
    ({"moe_eval_capacity_factor": 0.0}, "--moe-eval-capacity-factor 0.0 must be greater than 0"),
    ({"moe_min_capacity": -1}, "--moe-min-capacity -1 must be 0 or more"),
])
def test_refusals(changed, message):
    assert refusal(moe.validate, experts(**changed)).startswith(message)


def test_the_world_must_divide_into_expert_parallel_groups():
    assert refusal(moe.validate, experts(moe_expert_parallel_size=2, world_size=3)).startswith(
        "world size 3 is not divisible by --moe-expert-parallel-size 2")


def test_section_and_a_checkpoints_recorded_flags():
    section = moe.section(experts("--topk", "2", "--mlp-type", "residual"))
    assert section == MoEConfig(num_experts=(2,), expert_interval=2, mlp_type="residual", topk=2,
                                train_capacity_factor=1.0, eval_capacity_factor=1.0, min_capacity=4,
                                token_dropping=True, loss_coeff=0.1, create_param_group=False,
                                expert_parallel_size=1, expert_tensor_parallel=False)
    assert moe.recorded_moe_config(None).num_experts == (1,)
    assert moe.recorded_moe_config({"num_experts": [4], "unrelated": 1}).num_experts == (4,)
