"""Skipping a bf16 ZeRO step whose gradients are not finite, judged by the step's one gradient norm instead of
DeepSpeed's per-tensor check.

DeepSpeed's ZeRO-1/2 optimizer checks a bf16 step for inf/NaN gradients one tensor at a time: about seven
small kernels per parameter, launched from Python, every step. On a GPU that host work alone outlasts the
backward pass of a 345M model (56 ms of a 200 ms iteration on an H100). DeepSpeed's own check is switched off
(bf16.check_grad_overflow false in its config) and this guard, a step pre-hook of the torch optimizer DeepSpeed
drives, judges the step instead by the global gradient norm ZeRO has already computed for its clipping (over
every data- and model-parallel rank, non-finite when any gradient is): one norm serves both, with no norm,
collective or host read of the guard's own. ZeRO steps the torch optimizer once per parameter group with the
same norm, so the step is judged, and counted, once.

A bad step leaves the weights and the optimizer state untouched, so the weights DeepSpeed copies back are the
old ones. With torch's fused optimizers (the default AdamW on CUDA and CPU) the verdict goes to the optimizer as
`found_inf`, the input through which torch's GradScaler tells a fused step to skip itself on the device: the
host never waits for the GPU in mid-step. That holds only where the device's fused kernel reads `found_inf`
(FUSED_ADAMW_READS_FOUND_INF; op-plugin's NPU kernel ignores it). Other optimizers and devices wait for the
verdict, and a bad step drops the gradients, which makes the torch optimizer leave every parameter and its
state alone.
"""
from typing import Callable, Optional

import torch

from megatron.model.kernels import FUSED_ADAMW_READS_FOUND_INF, step_reads_found_inf


def zero_step_norm(engine) -> Callable[[], torch.Tensor]:
    """The norm of the step being taken by a DeepSpeed engine's ZeRO optimizer: its `_global_grad_norm`, set
    before it steps the torch optimizer (the attribute through which DeepSpeed's engine itself reads the norm
    of every optimizer it wraps, engine.py _take_model_step)."""
    return lambda: engine.optimizer._global_grad_norm


class NonFiniteStepGuard:
    def __init__(self, step_norm: Callable[[], torch.Tensor],
                 found_inf_devices: frozenset = FUSED_ADAMW_READS_FOUND_INF):
        """`step_norm`: the global gradient norm of the step being taken, a tensor that is new for each step
        (zero_step_norm); `found_inf_devices`: device types whose fused optimizer kernel skips a step given
        `found_inf`."""
        self._step_norm = step_norm
        self._found_inf_devices = found_inf_devices
        self._judged: Optional[torch.Tensor] = None  # the norm of the step judged last
        self._bad: Optional[torch.Tensor] = None  # its verdict, 1.0 for a non-finite step
        self.skipped: Optional[torch.Tensor] = None  # on the device; reading it waits for the step

    @property
    def skipped_steps(self) -> int:
        return 0 if self.skipped is None else int(self.skipped.item())

    def __call__(self, optimizer: torch.optim.Optimizer, args, kwargs) -> None:
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if not params:
            return
        norm = self._step_norm()
        if norm is not self._judged:  # the step's first parameter group
            self._judged = norm
            self._bad = (~torch.isfinite(norm)).float()
            self.skipped = self._bad.clone() if self.skipped is None else self.skipped + self._bad
        if step_reads_found_inf(optimizer, params[0].device.type, self._found_inf_devices):
            optimizer.found_inf = self._bad
        elif self._bad.item():
            for parameter in params:
                parameter.grad = None
