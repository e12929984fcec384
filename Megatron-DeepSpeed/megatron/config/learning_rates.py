"""Megatron's learning-rate schedule (AnnealingLR) as a pure function of consumed samples.

Counting in samples rather than optimizer steps is what Megatron does, and having no state makes
the schedule resume-safe: a restarted run gets the same rate from the restored sample count.
"""
import math
from typing import Mapping

from megatron.errors import InputError

DECAY_STYLES = ("constant", "linear", "cosine", "inverse-square-root")


def learning_rate(consumed_samples, *, max_lr, min_lr, warmup_samples, decay_samples,
                  decay_style, tokens_per_sample=1, warmup_tokens=None, decay_tokens=None, consumed_tokens=None,
                  warmup_end_tokens=None):
    """The rate after `consumed_samples`: linear warmup from 0 to max_lr, then the decay style
    down to min_lr at decay_samples, min_lr after that (inverse-square-root, upstream main's: max_lr x
    sqrt(warmup / consumed), never below min_lr).

    Token-based variants (--lr-warmup-tokens, --lr-decay-tokens; upstream's AnnealingLR) count
    consumed_samples x tokens_per_sample instead: a token warmup replaces the sample warmup, a token
    decay replaces the sample decay and starts where the warmup ended, whichever unit that was in. Where samples
    differ in length (a sequence-length curriculum), `consumed_tokens` is the count, and `warmup_end_tokens` the
    tokens a sample warmup consumed."""
    if decay_style not in DECAY_STYLES:
        raise InputError(f"--lr-decay-style {decay_style!r} is unknown; use one of "
                         f"{', '.join(DECAY_STYLES)}")
    if consumed_tokens is None:
        consumed_tokens = consumed_samples * tokens_per_sample
    if warmup_end_tokens is None:
        warmup_end_tokens = warmup_samples * tokens_per_sample
    if warmup_tokens is None:
        if warmup_samples > 0 and consumed_samples <= warmup_samples:
            return max_lr * consumed_samples / warmup_samples
    elif warmup_tokens > 0 and consumed_tokens <= warmup_tokens:
        return max_lr * consumed_tokens / warmup_tokens
    if decay_style == "constant":
        return max_lr
    if decay_tokens is None:
        position, start, end = consumed_samples, warmup_samples, decay_samples
    else:
        position, end = consumed_tokens, decay_tokens
        start = warmup_tokens if warmup_tokens is not None else warmup_end_tokens
    if position > end:
        return min_lr
    if decay_style == "inverse-square-root":  # upstream main's: max_lr x sqrt(warmup / consumed), at least min_lr
        # Counted in tokens where upstream's scheduler has a token warmup: given, or the tokens a sample warmup
        # consumed when the decay is token-based.
        if warmup_tokens is not None or (decay_tokens is not None and warmup_samples > 0):
            consumed = consumed_tokens
            warmup = warmup_tokens if warmup_tokens is not None else warmup_end_tokens
        else:
            consumed, warmup = consumed_samples, warmup_samples
        return max(min_lr, max_lr * math.sqrt(max(warmup, 1)) / math.sqrt(max(consumed, 1)))
    # Here start < position <= end, so the span is positive.
    ratio = (position - start) / (end - start)
    if decay_style == "linear":
        coeff = 1.0 - ratio
    else:
        coeff = 0.5 * (math.cos(math.pi * ratio) + 1.0)
    return min_lr + coeff * (max_lr - min_lr)


def schedule_samples(flags: Mapping):
    """(warmup_samples, decay_samples) from Megatron's flags (a mapping of their values). Iteration flags are
    scaled by the global batch size; a warmup fraction is taken of the decay length (and may be fractional, as
    in Megatron)."""
    if flags["train_iters"]:
        unit, scale = "iters", flags["global_batch_size"]
    elif flags["train_samples"]:
        unit, scale = "samples", 1
    else:
        raise InputError("the LR schedule needs a training length: give --train-iters N or "
                         "--train-samples N")
    decay = flags[f"lr_decay_{unit}"]
    if decay is None:
        decay = flags[f"train_{unit}"]
    decay_samples = decay * scale
    if decay_samples <= 0:
        raise InputError(f"--lr-decay-{unit} {decay} leaves no samples to decay over; give a "
                         f"positive --lr-decay-{unit} (default --train-{unit})")
    # A fraction of 0 counts as not given (like the schedule flag group), so it cannot hide an explicit
    # --lr-warmup-iters / --lr-warmup-samples.
    if flags["lr_warmup_fraction"]:
        warmup_samples = flags["lr_warmup_fraction"] * decay_samples
    else:
        warmup_samples = (flags[f"lr_warmup_{unit}"] or 0) * scale
    return warmup_samples, decay_samples
