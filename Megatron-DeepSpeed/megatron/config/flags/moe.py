"""Mixture-of-experts flags of Megatron-DeepSpeed (b4d4a0e's names, defaults and meanings), their validation and
the job's MoEConfig section. The layers themselves are DeepSpeed's (deepspeed.moe.layer.MoE, built by
megatron/model/moe.py): its top-k gate, capacity, token dropping, all-to-all and expert-parallel groups.

Which layers hold experts follows upstream: layer n (1-based) is an MoE layer when n is a multiple of
--expert-interval, and --num-experts gives one count for all of them or one count per MoE layer (PR-MoE's
pyramid). A count of 1 keeps that layer's dense MLP.
"""
import argparse
from typing import Any, Mapping, Optional

from megatron.config.job import MoEConfig
from megatron.errors import InputError, require_divisible

MLP_TYPES = ("standard", "residual")
# Defaults of the flags a --model-size preset may fill (megatron/config/presets.py: the MoE presets).
PRESET_DEFAULTS = {"num_experts": [1], "moe_expert_parallel_size": 1, "moe_loss_coeff": 0.1}


def add_flags(parser) -> None:
    group = parser.add_argument_group(
        "mixture of experts", "DeepSpeed's MoE layer in place of the MLP of every --expert-interval-th layer.")
    group.add_argument("--num-experts", type=int, nargs="+",
                       help="Experts per MoE layer: one count for all, or one per MoE layer (num-layers / "
                            "expert-interval values). Default 1: dense; --model-size may set it.")
    group.add_argument("--expert-interval", type=int, default=2,
                       help="Layers whose 1-based number is a multiple of this hold experts.")
    group.add_argument("--mlp-type", choices=MLP_TYPES, default="standard",
                       help="residual: PR-MoE, a dense MLP beside the experts, mixed per token by a learned "
                            "softmax coefficient (DeepSpeed's use_residual).")
    group.add_argument("--topk", type=int, choices=(1, 2), default=1, help="Experts each token is routed to.")
    group.add_argument("--moe-train-capacity-factor", type=float, default=1.0,
                       help="Expert capacity in training: this x tokens x topk / experts (at least "
                            "--moe-min-capacity); tokens past it are dropped.")
    group.add_argument("--moe-eval-capacity-factor", type=float, default=1.0,
                       help="The same during evaluation and generation.")
    group.add_argument("--moe-min-capacity", type=int, default=4, help="Smallest capacity of an expert.")
    group.add_argument("--disable-moe-token-dropping", action="store_false", dest="moe_token_dropping",
                       help="No capacity limit: every token reaches its experts.")
    group.add_argument("--moe-loss-coeff", type=float,
                       help="Weight of the gates' load-balancing loss, added to the LM loss and logged as "
                            "'moe loss'. Default 0.1; --model-size may set it.")
    group.add_argument("--create-moe-param-group", action="store_true",
                       help="Expert parameters in optimizer groups of their own (DeepSpeed's split); always so "
                            "under ZeRO, which partitions them over their expert-data-parallel ranks.")
    group.add_argument("--moe-expert-parallel-size", type=int,
                       help="Ranks the experts of a layer are spread over (DeepSpeed's expert-parallel groups of "
                            "consecutive ranks); tokens travel by all-to-all. Default 1; --model-size may set it.")
    group.add_argument("--enable-expert-tensor-parallelism", action="store_true",
                       help="Split each expert over the tensor-parallel ranks as the dense MLP is (first linear by "
                            "output, second by input features; DeepSpeed's expert groups then run across "
                            "tensor-parallel ranks). Without it every tensor-parallel rank holds whole experts.")
    group.add_argument("--use-tutel", action="store_true", help="Refused with experts: Tutel is not used here.")


def _check_counts(values: Mapping) -> None:
    counts, interval, layers = values["num_experts"], values["expert_interval"], values["num_layers"]
    if min(counts) < 1:
        raise InputError(f"--num-experts {' '.join(map(str, counts))}: every count must be at least 1")
    if interval < 1:
        raise InputError(f"--expert-interval {interval} must be at least 1")
    moe_layers = layers // interval
    if len(counts) != 1 and len(counts) != moe_layers:
        raise InputError(f"--num-experts has {len(counts)} values; give one, or one per MoE layer: --num-layers "
                         f"{layers} / --expert-interval {interval} = {moe_layers}")
    if max(counts) > 1 and moe_layers == 0:
        raise InputError(f"--num-experts {max(counts)} with --expert-interval {interval} above "
                         f"--num-layers {layers} leaves no MoE layer; lower --expert-interval")


def _check_parallel_layout(values: Mapping) -> None:
    ep = values["moe_expert_parallel_size"]
    if ep < 1:
        raise InputError(f"--moe-expert-parallel-size {ep} must be at least 1")
    for count in set(values["num_experts"]):
        if count > 1 and count % ep:
            raise InputError(f"--num-experts {count} is not divisible by --moe-expert-parallel-size {ep}: each "
                             f"expert-parallel rank holds the same number of experts; use a divisor of {count}")
    require_divisible("world size", values["world_size"], "--moe-expert-parallel-size", ep,
                      "DeepSpeed groups consecutive ranks into expert-parallel groups")
    if values["ds_pipeline_enabled"]:
        raise InputError("--num-experts above 1 needs DeepSpeed's plain engine: its pipeline engine does not carry "
                         "the MoE loss between stages (upstream runs MoE so too); add --no-pipeline-parallel and "
                         "use --pipeline-model-parallel-size 1")
    if values["sequence_parallel"]:
        raise InputError("--sequence-parallel with --num-experts above 1: DeepSpeed's MoE layer expects the same "
                         "tokens on every tensor-parallel rank; drop --sequence-parallel")
    if values["enable_expert_tensor_parallelism"]:
        require_divisible("the data-parallel size", values["data_parallel_size"], "--moe-expert-parallel-size", ep,
                          "with --enable-expert-tensor-parallelism DeepSpeed forms the expert-parallel groups "
                          "inside each data-parallel group")
        if values["tensor_model_parallel_size"] > 1 and not values["moe_token_dropping"]:
            raise InputError("--disable-moe-token-dropping with --enable-expert-tensor-parallelism at "
                             f"--tensor-model-parallel-size {values['tensor_model_parallel_size']}: DeepSpeed's "
                             "gate (0.19.8, deepspeed/moe/sharded_moe.py:253) then leaves the capacity unpadded, and "
                             "its split of the tokens over the tensor-parallel ranks fails unless every step's "
                             "largest expert load divides by that size; keep token dropping (a capacity factor of "
                             "experts / topk drops none)")
    if values["use_tutel"]:
        raise InputError("--use-tutel: Tutel's kernels are not supported by this trainer; drop the flag")
    if values["zero_stage"] == 3:
        raise InputError("--zero-stage 3 with --num-experts above 1: DeepSpeed's MoE layer trains under ZeRO "
                         "stages 0-2; use --zero-stage 2 or lower")


def validate(values: Mapping) -> None:
    """Checks of the MoE flags, after the parallel layout is resolved; a dense run (every count 1) only gets its
    counts checked, as upstream ignores the other MoE knobs then."""
    _check_counts(values)
    if max(values["num_experts"]) == 1:
        return
    _check_parallel_layout(values)
    for dest in ("moe_train_capacity_factor", "moe_eval_capacity_factor"):
        if values[dest] <= 0:
            raise InputError(f"--{dest.replace('_', '-')} {values[dest]} must be greater than 0 (1.0: an even share "
                             "of the tokens)")
    for dest in ("moe_min_capacity", "moe_loss_coeff"):
        if values[dest] < 0:
            raise InputError(f"--{dest.replace('_', '-')} {values[dest]} must be 0 or more")


def section(values: Mapping) -> MoEConfig:
    return MoEConfig(num_experts=tuple(values["num_experts"]), expert_interval=values["expert_interval"],
                     mlp_type=values["mlp_type"], topk=values["topk"],
                     train_capacity_factor=values["moe_train_capacity_factor"],
                     eval_capacity_factor=values["moe_eval_capacity_factor"], min_capacity=values["moe_min_capacity"],
                     token_dropping=values["moe_token_dropping"], loss_coeff=values["moe_loss_coeff"],
                     create_param_group=values["create_moe_param_group"],
                     expert_parallel_size=values["moe_expert_parallel_size"],
                     expert_tensor_parallel=values["enable_expert_tensor_parallelism"])


def recorded_moe_config(flags: Optional[Mapping[str, Any]]) -> MoEConfig:
    """The MoE section of the flags a checkpoint recorded; upstream's defaults for those it lacks (a dense run's
    or an older checkpoint's)."""
    parser = argparse.ArgumentParser()
    add_flags(parser)
    values = {**vars(parser.parse_args([])), **PRESET_DEFAULTS}
    values.update({key: value for key, value in (flags or {}).items() if key in values})
    return section(values)
