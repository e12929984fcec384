"""Activation-checkpointing flags: whether layers are recomputed in backward, which ones, and DeepSpeed's
checkpointing options; the ActivationCheckpointingConfig section."""
import argparse
from typing import Mapping

from megatron.config.flags.common import after_preset
from megatron.config.job import ActivationCheckpointingConfig
from megatron.errors import InputError

PRESET_DEFAULTS = {"checkpoint_activations": False}


def add_flags(parser) -> None:
    group = parser.add_argument_group(
        "activation checkpointing", "--checkpoint-activations turns recomputation on; these choose how.")
    group.add_argument("--checkpoint-activations", action=argparse.BooleanOptionalAction,
                       help="Recompute each layer's activations in backward. "
                            + after_preset(PRESET_DEFAULTS["checkpoint_activations"]))
    group.add_argument("--checkpoint-num-layers", type=int, default=1,
                       help="Transformer layers per recomputed chunk.")
    group.add_argument("--distribute-checkpointed-activations", action="store_true",
                       help="Split the saved chunk inputs over the tensor-parallel group (DeepSpeed's "
                            "partition_activations; implies --deepspeed-activation-checkpointing).")
    group.add_argument("--deepspeed-activation-checkpointing", action="store_true",
                       help="Recompute with deepspeed.checkpointing (configured by the flags below) instead "
                            "of torch.utils.checkpoint.")
    group.add_argument("--partition-activations", action="store_true",
                       help="DeepSpeed: split saved activations over the tensor-parallel group.")
    group.add_argument("--contigious-checkpointing", action="store_true",
                       help="DeepSpeed: keep partitioned checkpoints in one contiguous buffer (needs "
                            "--partition-activations). Upstream's spelling.")
    group.add_argument("--checkpoint-in-cpu", action="store_true",
                       help="DeepSpeed: keep the saved activations in CPU memory.")
    group.add_argument("--synchronize-each-layer", action="store_true",
                       help="DeepSpeed: synchronise the device before and after each checkpointed chunk.")
    group.add_argument("--profile-backward", action="store_true",
                       help="DeepSpeed: log forward/backward times of each checkpointed chunk.")


def resolve(values: Mapping) -> dict:
    """--distribute-checkpointed-activations turns on DeepSpeed's partitioned checkpointing; checks."""
    if values["checkpoint_num_layers"] < 1:
        raise InputError(f"--checkpoint-num-layers {values['checkpoint_num_layers']} must be 1 or more")
    implied = {}
    if values["distribute_checkpointed_activations"]:
        if not values["checkpoint_activations"]:
            raise InputError("--distribute-checkpointed-activations splits the activations that "
                             "--checkpoint-activations saves; add --checkpoint-activations")
        implied = {"deepspeed_activation_checkpointing": True, "partition_activations": True}
    if values["contigious_checkpointing"] and not {**values, **implied}["partition_activations"]:
        raise InputError("--contigious-checkpointing packs partitioned activations; add "
                         "--partition-activations (DeepSpeed supports it only with partitioning)")
    return implied


def section(values: Mapping) -> ActivationCheckpointingConfig:
    return ActivationCheckpointingConfig(
        deepspeed=values["deepspeed_activation_checkpointing"], partition_activations=values["partition_activations"],
        contiguous_checkpointing=values["contigious_checkpointing"], checkpoint_in_cpu=values["checkpoint_in_cpu"],
        synchronize=values["synchronize_each_layer"], profile=values["profile_backward"])
