"""Divergence: iterations whose loss or gradients are not finite, and the run that keeps having them.

Skipping such an update is the engine's job, and DeepSpeed does it in every configuration but one: fp16
through its loss scaler, and bf16 or fp32 under ZeRO (and bf16 without it) through the check of the global
gradient norm that precedes its optimizer step; each skip counts in `engine.skipped_steps`. The exception,
fp32 without ZeRO, hands the gradients straight to the torch optimizer; there the training loop's own
clipping (training.Fp32GradientClipping), which computes the norm anyway, drops the gradients of a
non-finite step, so the optimizer leaves every parameter and its state alone.

What this module adds is the judgement: an iteration is bad when its loss is not finite, or when its update
was skipped for non-finite gradients (with fp16 a skip is the loss scaler searching its scale, which is not
divergence, so there only the loss counts). The verdict is all-reduced, so every rank stops at the same
iteration; after `limit` bad iterations in a row the run stops with a RunError naming them. And a
checkpoint is written only of finite weights (`weights_are_finite`).
"""
import logging
import math
import os
from typing import Optional

import torch
import torch.distributed as dist

from megatron import device
from megatron.checkpoint.trainer.guard import latest_tag
from megatron.checkpoint.file_names import LATEST_TAG_FILE
from megatron.errors import RunError
from megatron.training.log_lines import DIVERGED_FORMAT

_log = logging.getLogger(__name__)

LIMIT_FLAG = "--max-consecutive-nan-iterations"


ADVICE = "lower --lr or raise --lr-warmup-iters (or check --init-method-std), then resume from it"


def kept_checkpoint(save_dir: Optional[str]) -> str:
    """Which checkpoint survives a diverged run, in words."""
    tag = latest_tag(save_dir) if save_dir else None
    if tag is None:
        return "no checkpoint was saved before it"
    return f"{os.path.join(save_dir, LATEST_TAG_FILE)} still names {tag}, saved before it"


def any_rank_each(flags: list) -> list:
    """For each flag, True on every rank when it is true on any of them (one all-reduce for them all)."""
    if not flags:
        return []
    values = torch.tensor([1.0 if flag else 0.0 for flag in flags], device=device.current_device())
    dist.all_reduce(values, op=dist.ReduceOp.MAX)
    return [bool(value) for value in values.tolist()]


def any_rank(flag: bool) -> bool:
    """True on every rank when `flag` is true on any of them."""
    return any_rank_each([flag])[0]


class DivergenceMonitor:
    """Counts bad iterations in a row; raises RunError at `limit`. `save_dir` (--save) is named in that
    message: no checkpoint is written during a run of bad iterations, so its `latest` predates them."""

    def __init__(self, limit: int, loss_scaling: bool, save_dir: Optional[str]):
        self.limit, self.loss_scaling, self.save_dir = limit, loss_scaling, save_dir
        self.in_a_row = 0

    def judge(self, losses: list, updates_skipped: list) -> list:
        """Whether each iteration (its loss, and whether its update was skipped) counts towards divergence:
        the same answers on every rank, agreed in one all-reduce."""
        bad = [not math.isfinite(loss) or (skipped and not self.loss_scaling)
               for loss, skipped in zip(losses, updates_skipped)]
        return any_rank_each(bad)

    def count(self, iteration: int, bad: bool, loss: float, grad_norm: float, update_skipped: bool) -> None:
        """Count a judged iteration: a warning for a bad one, a RunError at the limit."""
        if not bad:
            self.in_a_row = 0
            return
        self.in_a_row += 1
        if self.in_a_row >= self.limit:
            raise self._diverged(iteration, f"({self.limit} in a row, {LIMIT_FLAG})")
        if dist.get_rank() == dist.get_world_size() - 1:
            _log.warning(f"iteration {iteration}: lm loss {loss:.6E}, grad norm {grad_norm:.3f}: not finite, the "
                         f"update was {'skipped' if update_skipped else 'applied'} ({self.in_a_row} bad "
                         f"iteration(s) in a row; the run stops at {self.limit}, {LIMIT_FLAG})")

    def require_recovered(self, last_iteration: int) -> None:
        """A run whose last iterations were bad ends as diverged, however few they were."""
        if self.in_a_row:
            raise self._diverged(last_iteration, "(the last iterations of the run)")

    def _diverged(self, iteration: int, which: str) -> RunError:
        first = iteration - self.in_a_row + 1
        return RunError(f"{DIVERGED_FORMAT.format(iteration=iteration)}: iterations {first} to {iteration} "
                        f"{which} had a non-finite loss or gradient norm and their updates were skipped; "
                        f"{kept_checkpoint(self.save_dir)}; {ADVICE}")

    def may_save(self, iteration: int) -> bool:
        """No checkpoint during a run of bad iterations: `latest` stays on the state before them."""
        if self.in_a_row and dist.get_rank() == dist.get_world_size() - 1:
            _log.info(f"iteration {iteration}: no checkpoint during non-finite iterations ({self.in_a_row} in a "
                      f"row); {kept_checkpoint(self.save_dir)}")
        return not self.in_a_row

    def require_finite_weights(self, module: torch.nn.Module, iteration: int) -> None:
        """Raise RunError instead of letting weights that hold inf or NaN be saved."""
        if not weights_are_finite(module):
            raise RunError(f"{DIVERGED_FORMAT.format(iteration=iteration)}: the weights hold non-finite values, so "
                           f"no checkpoint of them was written; {kept_checkpoint(self.save_dir)}; {ADVICE}")


def weights_are_finite(module: torch.nn.Module) -> bool:
    """Whether every rank's parameters are all finite (ZeRO-3 holds each rank's partition in ds_tensor)."""
    finite = True
    with torch.no_grad():
        for parameter in module.parameters():
            values = getattr(parameter, "ds_tensor", parameter)
            if values.numel() and not bool(torch.isfinite(values).all()):
                finite = False
                break
    return not any_rank(not finite)
