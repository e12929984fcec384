"""Megatron's AnnealingLR rule by hand-computed values, and the flag-to-samples conversion."""
import math

import pytest

from megatron.config.arguments import parse_args
from megatron.config.learning_rates import learning_rate, schedule_samples
from megatron.errors import InputError

# Peak 1.0, floor 0.1, warmup over 10 samples, decay until sample 110 (100 samples of decay).
SCHEDULE = dict(max_lr=1.0, min_lr=0.1, warmup_samples=10, decay_samples=110)


def lr_at(consumed, style, **overrides):
    return learning_rate(consumed, **{**SCHEDULE, **overrides}, decay_style=style)


@pytest.mark.parametrize("style", ["constant", "linear", "cosine"])
@pytest.mark.parametrize("consumed, expected", [(0, 0.0), (1, 0.1), (5, 0.5), (10, 1.0)])
def test_warmup_is_linear_from_zero_and_includes_its_last_sample(style, consumed, expected):
    assert lr_at(consumed, style) == pytest.approx(expected)


@pytest.mark.parametrize("consumed, expected", [
    (35, 0.1 + 0.75 * 0.9),   # a quarter of the decay done
    (60, 0.55),               # half way
    (100, 0.1 + 0.1 * 0.9),   # 90 % done
    (110, 0.1),               # the end
])
def test_linear_decay(consumed, expected):
    assert lr_at(consumed, "linear") == pytest.approx(expected)


@pytest.mark.parametrize("consumed, expected", [
    (35, 0.868198051534),     # 0.1 + 0.9 * 0.5 * (cos(pi/4) + 1)
    (60, (1.0 + 0.1) / 2),    # the midpoint is the mean of peak and floor
    (110, 0.1),               # cos(pi) = -1: the floor
])
def test_cosine_decay(consumed, expected):
    assert lr_at(consumed, "cosine") == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("style", ["linear", "cosine"])
def test_past_the_decay_the_rate_stays_at_the_floor(style):
    assert lr_at(111, style) == 0.1
    assert lr_at(10 ** 9, style) == 0.1


def test_constant_style_keeps_the_peak_after_warmup_forever():
    assert [lr_at(n, "constant") for n in (11, 60, 110, 10 ** 9)] == [1.0] * 4


def test_without_warmup_the_first_sample_gets_the_peak():
    assert lr_at(0, "cosine", warmup_samples=0) == 1.0
    assert lr_at(55, "linear", warmup_samples=0) == pytest.approx(0.1 + 0.5 * 0.9)


def test_fractional_warmup_from_a_warmup_fraction():
    assert lr_at(3, "linear", warmup_samples=2.5, decay_samples=5) == pytest.approx(
        0.1 + 0.8 * 0.9)
    assert lr_at(2, "linear", warmup_samples=2.5, decay_samples=5) == pytest.approx(0.8)


@pytest.mark.parametrize("consumed, expected", [(10, 1.0), (40, 0.5), (90, 1 / 3), (110, 10 ** 0.5 / 110 ** 0.5),
                                               (111, 0.1)])
def test_inverse_square_root_decay_as_upstream_main(consumed, expected):
    """max_lr x sqrt(warmup / consumed) after the warmup, never below min_lr; min_lr past the decay."""
    assert lr_at(consumed, "inverse-square-root") == pytest.approx(expected)
    assert lr_at(10 ** 4, "inverse-square-root", decay_samples=10 ** 5, min_lr=0.05) == 0.05


def test_inverse_square_root_counts_tokens_where_the_warmup_is_in_tokens():
    tokens = dict(tokens_per_sample=4, decay_tokens=10 ** 6)
    # Sample warmup (10 samples = 40 tokens) with token decay: upstream takes the warmup's tokens.
    assert lr_at(160, "inverse-square-root", **tokens) == pytest.approx((40 / 640) ** 0.5)
    assert lr_at(160, "inverse-square-root", warmup_tokens=100, **tokens) == pytest.approx((100 / 640) ** 0.5)
    assert lr_at(40, "inverse-square-root", tokens_per_sample=4) == pytest.approx(0.5)  # samples without tokens


def test_unknown_decay_style_names_the_flag():
    with pytest.raises(InputError, match="--lr-decay-style 'Cosine'"):
        lr_at(50, "Cosine")


def flags(**values):
    base = dict(train_iters=None, train_samples=None, global_batch_size=16,
                lr_decay_iters=None, lr_decay_samples=None, lr_warmup_fraction=None,
                lr_warmup_iters=None, lr_warmup_samples=None)
    return {**base, **values}


def test_iterations_are_scaled_by_the_global_batch_size():
    args = flags(train_iters=100, lr_decay_iters=80, lr_warmup_iters=5)
    assert schedule_samples(args) == (80, 1280)


def test_decay_defaults_to_train_iters_and_warmup_fraction_is_of_the_decay():
    args = flags(train_iters=100, lr_warmup_fraction=0.01)
    assert schedule_samples(args) == (16.0, 1600)


def test_no_warmup_flag_means_no_warmup():
    assert schedule_samples(flags(train_iters=100)) == (0, 1600)


def test_samples_flags_are_used_directly():
    args = flags(train_samples=1000, lr_warmup_samples=50, global_batch_size=7)
    assert schedule_samples(args) == (50, 1000)
    args = flags(train_samples=1000, lr_decay_samples=600, lr_warmup_fraction=0.1)
    assert schedule_samples(args) == pytest.approx((60.0, 600))


def test_a_zero_warmup_fraction_does_not_hide_warmup_iters():
    args = flags(train_iters=100, lr_warmup_fraction=0.0, lr_warmup_iters=2)
    assert schedule_samples(args) == (32, 1600)


def test_missing_training_length_is_an_input_error():
    with pytest.raises(InputError, match="--train-iters N or --train-samples N"):
        schedule_samples(flags())


def test_zero_decay_length_is_an_input_error():
    with pytest.raises(InputError, match="--lr-decay-samples 0"):
        schedule_samples(flags(train_samples=100, lr_decay_samples=0))


def test_the_345m_preset_schedule_from_real_flags():
    """Attribute names as arguments.py defines them: 320000 decay iterations x 16 samples,
    1 % warmup."""
    args = parse_args(["--model-size", "345M", "--train-iters", "500000",
                       "--global-batch-size", "16", "--lr-warmup-fraction", "0.01"])
    warmup, decay = schedule_samples(vars(args))
    assert (warmup, decay) == (51200.0, 5120000)
    midpoint = learning_rate((warmup + decay) / 2, max_lr=args.lr, min_lr=args.min_lr,
                             warmup_samples=warmup, decay_samples=decay,
                             decay_style=args.lr_decay_style)
    assert args.lr_decay_style == "cosine"
    assert midpoint == pytest.approx((1.5e-4 + 1.5e-5) / 2)
    assert math.isclose(learning_rate(decay + 1, max_lr=args.lr, min_lr=args.min_lr,
                                      warmup_samples=warmup, decay_samples=decay,
                                      decay_style="cosine"), 1.5e-5)
