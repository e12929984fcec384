"""Training-length and learning-rate flags (megatron/config/flags/schedule.py): one training length, the decay and
warmup lengths it defaults, the refusals, and the ScheduleConfig in samples."""
import pytest

from megatron.config.flags import schedule
from megatron.config.job import ScheduleConfig
from tests.helpers.flag_groups import parsed_alone, refusal, resolved


def test_nothing_is_set_by_the_group_itself():
    assert set(parsed_alone(schedule).values()) == {None}  # defaults come after a preset (PRESET_DEFAULTS)


def test_the_decay_defaults_to_the_training_length():
    values = resolved("--lr-warmup-iters", "2")
    assert (values["lr_decay_iters"], values["lr_warmup_iters"], values["lr_warmup_samples"]) == (10, 2, 0)


@pytest.mark.parametrize("changed, message", [
    ({"train_iters": None}, "give exactly one of --train-iters or --train-samples; neither was given"),
    ({"train_samples": 40}, "give exactly one of --train-iters or --train-samples; both --train-iters 10 and "
                            "--train-samples 40 were given"),
    ({"lr_warmup_iters": 2, "lr_warmup_fraction": 0.1}, "give at most one LR warmup, but --lr-warmup-fraction 0.1 "
                                                        "and --lr-warmup-iters 2 were given"),
    ({"lr_decay_samples": 8}, "--lr-decay-samples 8 counts samples, but training length is --train-iters 10; use "
                              "--lr-decay-iters / --lr-warmup-iters instead"),
    ({"lr_warmup_fraction": 1.5}, "--lr-warmup-fraction 1.5 makes the warmup longer than the LR decay; use a "
                                  "fraction between 0 and 1"),
    ({"lr_warmup_iters": 11}, "--lr-warmup-iters 11 is longer than the LR decay (--lr-decay-iters 10, which "
                              "defaults to --train-iters); shorten the warmup or lengthen the decay"),
    ({"min_lr": 0.1}, "--lr 0.001 is below --min-lr 0.1; the peak learning rate must be at least the floor"),
    ({"train_tokens": -1}, "--train-tokens -1 must be 0 or more"),
    ({"lr_decay_tokens": 100, "lr_warmup_tokens": 100}, "--lr-decay-tokens 100 must be longer than "
                                                        "--lr-warmup-tokens 100: the decay starts where the warmup "
                                                        "ends"),
])
def test_refusals(changed, message):
    values = {**resolved(), "lr_decay_iters": None, "lr_warmup_iters": None, **changed}
    assert refusal(schedule.lengths, values) == message


def test_section_in_samples():
    values = resolved("--global-batch-size", "4", "--lr-warmup-iters", "2", "--lr-decay-style", "cosine",
                      "--min-lr", "1e-4")
    assert schedule.section(values) == ScheduleConfig(
        train_iters=10, train_samples=None, lr=1e-3, min_lr=1e-4, decay_style="cosine", warmup_samples=8,
        decay_samples=40, train_tokens=None, tokens_per_sample=16, warmup_tokens=None, decay_tokens=None)
