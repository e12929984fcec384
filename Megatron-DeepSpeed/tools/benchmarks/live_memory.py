"""The bytes of live tensors during training, counted the same way on every device, the CPU included.

An allocator's statistics (device.memory_stats' peak) exist only on an accelerator. This counts what they
count, the storages tensors hold, from torch's dispatcher: every operator's output storage is
added when first seen and taken off when Python frees it, so the peak of a real training step can be read on a
CPU and set beside the layout planner's estimate (tools/benchmark_planner_memory.py). It sees what torch
allocates through operators (parameters, gradients, optimizer state, activations, communication buffers that
are tensors) and not what kernels allocate internally (cuBLAS workspaces) or allocator rounding. A storage that
changes size in place (ZeRO-3's resize_) keeps the size it was first seen with.

Phases come from two of torch's global hooks: a module's forward and the step of the torch optimizer DeepSpeed
wraps.
"""
import weakref
from dataclasses import dataclass, field

import torch
from torch.nn.modules.module import register_module_forward_pre_hook
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary


class LiveTensorBytes(TorchDispatchMode):
    """Inside `with LiveTensorBytes() as live:`, live.now is the bytes of the storages alive that were made in
    the block; live.peak the most at any time since the last take_peak()."""

    def __init__(self):
        super().__init__()
        self.now = 0
        self.peak = 0
        self._counted = WeakIdKeyDictionary()  # storage -> bytes counted for it

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        for value in tree_leaves(result):
            if isinstance(value, torch.Tensor):
                self._count(value.untyped_storage())
        return result

    def _count(self, storage: torch.UntypedStorage) -> None:
        if storage in self._counted or storage.nbytes() == 0 or storage.device.type == "meta":
            return  # meta tensors (shapes DeepSpeed keeps) hold no memory
        size = storage.nbytes()
        self._counted[storage] = size
        weakref.finalize(storage, self._freed, size)
        self.now += size
        self.peak = max(self.peak, self.now)

    def _freed(self, size: int) -> None:
        self.now -= size

    def take_peak(self) -> int:
        """The peak since the last call, then start the next period from what is alive now."""
        peak, self.peak = self.peak, self.now
        return peak


@dataclass
class IterationPeaks:
    """The peak bytes of start-up (until the first forward) and, per iteration, from its first forward to the
    optimizer's step (forward, backward, gradient reduction) and from there to the next iteration's first forward
    (the step: DeepSpeed steps torch's optimizer once per parameter group, then gathers the updated weights)."""
    start_up: int = 0
    forward_backward: list = field(default_factory=list)
    optimizer_step: list = field(default_factory=list)


class IterationPeakRecorder:
    """Splits `live`'s peak where a phase of IterationPeaks ends."""

    def __init__(self, live: LiveTensorBytes):
        self.live = live
        self.peaks = IterationPeaks()
        self._phase = "start-up"

    def module_forward(self, *_) -> None:
        if self._phase == "start-up":
            self.peaks.start_up = self.live.take_peak()
        elif self._phase == "step":
            self.peaks.optimizer_step.append(self.live.take_peak())
        self._phase = "forward/backward"

    def optimizer_step(self, *_) -> None:
        if self._phase == "forward/backward":
            self.peaks.forward_backward.append(self.live.take_peak())
            self._phase = "step"

    def finish(self) -> None:
        self.module_forward()


def record_iteration_peaks(train) -> IterationPeaks:
    """Run `train` (a pretrain call without evaluation) counting live tensors from its start; the peaks by
    phase."""
    live = LiveTensorBytes()
    recorder = IterationPeakRecorder(live)
    hooks = (register_module_forward_pre_hook(recorder.module_forward),
             register_optimizer_step_pre_hook(recorder.optimizer_step))
    try:
        with live:
            train()
        recorder.finish()
    finally:
        for hook in hooks:
            hook.remove()
    return recorder.peaks
