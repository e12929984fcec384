"""Activation-checkpointing flags: whether layers are recomputed in backward, which ones, and DeepSpeed's
checkpointing options; the ActivationCheckpointingConfig section.

Two spellings, as upstream main keeps both: b4d4a0e's --checkpoint-activations (chunks of --checkpoint-num-layers
layers) and main's --recompute-granularity full|selective with --recompute-method uniform|block and
--recompute-num-layers (megatron/model/gpt.py `recomputed_chunks` says which layers each recomputes)."""
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
    _add_recompute_flags(parser)


def _add_recompute_flags(parser) -> None:
    group = parser.add_argument_group(
        "recomputation (upstream main's spelling)", "An alternative to --checkpoint-activations; give one of them.")
    group.add_argument("--recompute-granularity", choices=("full", "selective"),
                       help="full: recompute whole transformer layers (as --recompute-method says); selective: "
                            "keep every layer's activations except its attention core (softmax(QK^T)V and its "
                            "dropout), which is recomputed: the memory-heavy, FLOP-light part.")
    group.add_argument("--recompute-activations", action="store_true",
                       help="Upstream main's short form of --recompute-granularity selective.")
    group.add_argument("--recompute-method", choices=("uniform", "block"),
                       help="With --recompute-granularity full: uniform recomputes chunks of --recompute-num-layers "
                            "layers (every layer); block recomputes only the first --recompute-num-layers layers "
                            "of each pipeline stage, one at a time, and keeps the rest.")
    group.add_argument("--recompute-num-layers", type=int, default=1,
                       help="uniform: layers per recomputed chunk; block: layers recomputed per stage.")
    group.add_argument("--distribute-saved-activations", action="store_true",
                       help="Upstream main's --distribute-checkpointed-activations for --recompute-granularity "
                            "full: split the saved layer inputs over the tensor-parallel group.")


def recompute_granularity(values: Mapping) -> dict:
    """Upstream main's recompute flags checked as upstream checks them (where upstream ignores a flag silently, an
    InputError instead); --recompute-activations becomes --recompute-granularity selective."""
    granularity = "selective" if values["recompute_activations"] else values["recompute_granularity"]
    method, layers = values["recompute_method"], values["recompute_num_layers"]
    if layers < 1:
        raise InputError(f"--recompute-num-layers {layers} must be 1 or more")
    if granularity == "full" and values["checkpoint_activations"]:
        raise InputError("--checkpoint-activations and --recompute-granularity full both choose the layers to "
                         "recompute; give one of them")
    if granularity == "selective" and method is not None:
        raise InputError(f"--recompute-method {method} chooses whole layers to recompute; selective granularity "
                         "recomputes every layer's attention core, so drop --recompute-method (upstream refuses it too)")
    if granularity == "full" and method is None:
        raise InputError("--recompute-granularity full needs --recompute-method uniform (every layer, in chunks of "
                         "--recompute-num-layers) or block (the first --recompute-num-layers of each stage)")
    if granularity is None and method is not None:
        raise InputError(f"--recompute-method {method} has no effect without --recompute-granularity full; add it "
                         "or drop the flag")
    if values["distribute_saved_activations"]:
        if granularity != "full":
            raise InputError("--distribute-saved-activations splits the layer inputs that --recompute-granularity "
                             "full saves; add --recompute-granularity full and a --recompute-method")
        if values["tensor_model_parallel_size"] == 1:
            raise InputError("--distribute-saved-activations splits saved activations over the tensor-parallel "
                             "group; it needs --tensor-model-parallel-size above 1")
    return {"recompute_granularity": granularity}


def resolve(values: Mapping) -> dict:
    """--distribute-checkpointed-activations (or main's --distribute-saved-activations) turns on DeepSpeed's
    partitioned checkpointing; checks."""
    if values["checkpoint_num_layers"] < 1:
        raise InputError(f"--checkpoint-num-layers {values['checkpoint_num_layers']} must be 1 or more")
    implied = recompute_granularity(values)
    if values["distribute_saved_activations"]:
        implied.update(deepspeed_activation_checkpointing=True, partition_activations=True)
    if values["distribute_checkpointed_activations"]:
        if not values["checkpoint_activations"]:
            raise InputError("--distribute-checkpointed-activations splits the activations that "
                             "--checkpoint-activations saves; add --checkpoint-activations")
        implied.update(deepspeed_activation_checkpointing=True, partition_activations=True)
    if values["contigious_checkpointing"] and not {**values, **implied}["partition_activations"]:
        raise InputError("--contigious-checkpointing packs partitioned activations; add "
                         "--partition-activations (DeepSpeed supports it only with partitioning)")
    return implied


def section(values: Mapping) -> ActivationCheckpointingConfig:
    return ActivationCheckpointingConfig(
        deepspeed=values["deepspeed_activation_checkpointing"], partition_activations=values["partition_activations"],
        contiguous_checkpointing=values["contigious_checkpointing"], checkpoint_in_cpu=values["checkpoint_in_cpu"],
        synchronize=values["synchronize_each_layer"], profile=values["profile_backward"])
