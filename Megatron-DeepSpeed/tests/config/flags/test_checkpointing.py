"""Checkpoint flags (megatron/config/flags/checkpointing.py): defaults, upstream main's aliases, the refusals and
the CheckpointConfig."""
import pytest

from megatron.config.flags import checkpointing
from megatron.config.job import CheckpointConfig
from tests.helpers.flag_groups import parsed_alone, refusal, resolved


def test_defaults_and_upstream_mains_names():
    values = parsed_alone(checkpointing)
    assert values["save"] is None and values["save_interval"] is None and values["trust_checkpoint"] is None
    assert not any(values[dest] for dest in ("finetune", "no_load_optim", "no_load_rng", "universal_checkpoint",
                                             "override_lr_scheduler", "use_checkpoint_lr_scheduler"))
    aliased = parsed_alone(checkpointing, "--override-opt_param-scheduler", "--use-checkpoint-opt_param-scheduler")
    assert aliased["override_lr_scheduler"] and aliased["use_checkpoint_lr_scheduler"]


@pytest.mark.parametrize("changed, message", [
    ({"save": "ckpt", "save_interval": None}, "--save ckpt needs --save-interval N (iterations between checkpoints)"),
    ({"no_save_optim": True, "zero_stage": 3}, "--no-save-optim with --zero-stage 3: ZeRO-3 keeps the weights in "
                                               "its optimizer partitions, so they cannot be left out; drop "
                                               "--no-save-optim or use --zero-stage 0-2"),
])
def test_refusals(changed, message):
    assert refusal(checkpointing.validate, {**resolved(), **changed}) == message


def test_section():
    values = resolved("--save", "ckpt", "--save-interval", "5", "--trust-checkpoint", "numpy.dtype",
                      "--trust-checkpoint", "collections.OrderedDict")
    assert checkpointing.section(values) == CheckpointConfig(
        save="ckpt", load=None, save_interval=5, finetune=False, no_load_optim=False, no_load_rng=False,
        no_save_optim=False, override_lr_scheduler=False, use_checkpoint_lr_scheduler=False, reset_iteration=False,
        no_save_rng=False, universal_checkpoint=False, trust_checkpoint=("numpy.dtype", "collections.OrderedDict"))
