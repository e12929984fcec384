"""Activation-checkpointing flags (megatron/config/flags/activation_checkpointing.py): both spellings (b4d4a0e's
--checkpoint-activations and main's --recompute-*), what they imply for DeepSpeed's checkpointing, the refusals,
and the ActivationCheckpointingConfig."""
import pytest

from megatron.config.flags import activation_checkpointing as checkpointing
from megatron.config.job import ActivationCheckpointingConfig
from tests.helpers.flag_groups import parsed_alone, refusal, resolved


def test_defaults():
    values = parsed_alone(checkpointing)
    assert values["checkpoint_activations"] is None  # the preset's default (False) applies after
    assert (values["checkpoint_num_layers"], values["recompute_num_layers"], values["recompute_granularity"]) == (
        1, 1, None)


def test_recompute_activations_is_selective_granularity():
    assert checkpointing.recompute_granularity({**resolved(), "recompute_activations": True}) == {
        "recompute_granularity": "selective"}


def test_distributing_the_saved_activations_turns_on_deepspeeds_partitioning():
    implied = checkpointing.resolve({**resolved(), "checkpoint_activations": True,
                                     "distribute_checkpointed_activations": True})
    assert implied == {"recompute_granularity": None, "deepspeed_activation_checkpointing": True,
                       "partition_activations": True}


@pytest.mark.parametrize("changed, message", [
    ({"checkpoint_num_layers": 0}, "--checkpoint-num-layers 0 must be 1 or more"),
    ({"recompute_num_layers": 0}, "--recompute-num-layers 0 must be 1 or more"),
    ({"recompute_granularity": "full", "checkpoint_activations": True, "recompute_method": "uniform"},
     "--checkpoint-activations and --recompute-granularity full both choose the layers to recompute; give one of "
     "them"),
    ({"recompute_granularity": "selective", "recompute_method": "block"},
     "--recompute-method block chooses whole layers to recompute; selective granularity"),
    ({"recompute_granularity": "full"}, "--recompute-granularity full needs --recompute-method uniform"),
    ({"recompute_method": "uniform"}, "--recompute-method uniform has no effect without --recompute-granularity full"),
    ({"distribute_saved_activations": True}, "--distribute-saved-activations splits the layer inputs that "
                                             "--recompute-granularity full saves"),
    ({"distribute_saved_activations": True, "recompute_granularity": "full", "recompute_method": "uniform"},
     "--distribute-saved-activations splits saved activations over the tensor-parallel group; it needs "
     "--tensor-model-parallel-size above 1"),
    ({"distribute_checkpointed_activations": True}, "--distribute-checkpointed-activations splits the activations "
                                                    "that --checkpoint-activations saves; add "
                                                    "--checkpoint-activations"),
    ({"contigious_checkpointing": True}, "--contigious-checkpointing packs partitioned activations; add "
                                         "--partition-activations"),
])
def test_refusals(changed, message):
    assert refusal(checkpointing.resolve, {**resolved(), **changed}).startswith(message)


def test_section():
    values = resolved("--checkpoint-activations", "--distribute-checkpointed-activations", "--checkpoint-in-cpu")
    assert checkpointing.section(values) == ActivationCheckpointingConfig(
        deepspeed=True, partition_activations=True, contiguous_checkpointing=False, checkpoint_in_cpu=True,
        synchronize=False, profile=False)
