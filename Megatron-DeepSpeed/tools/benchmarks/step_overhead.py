"""Where a training step's host time goes: cProfile over whole logged iterations of a real run, its time sorted
into the kinds of work a step does (the model's own forward, backward and optimizer math, and everything the
framework adds around them: data, DeepSpeed's wrappers, ZeRO, guards, clipping, schedule, logging, host reads).

The window opens and closes on iteration lines (as megatron/training/profiler.py steps torch.profiler), so it
holds whole iterations after a warm-up with no hook inside the training loop. Each function's own time
(cProfile's tottime) goes to the category of its file; a built-in (a torch operator, a C method) goes to the
category of the Python function that called it, except reads of a tensor's value, which are their own category.
cProfile slows Python-heavy code more than operator-heavy code, so the figures rank the categories; step
times are measured without it, as wall time and as this process's CPU time.
"""
import cProfile
import gc
import logging
import pstats
import resource
import time
from typing import Callable, Optional

from megatron.training.log_lines import parse_log

HOST_READS = "host reads of tensor values"
GARBAGE_COLLECTOR = "Python garbage collector (inside the others)"

# (category, path fragments or function-name suffixes); the first match wins, so the specific come first.
_FILE_RULES = (
    ("data loader and batch building", ("megatron/data/", "torch/utils/data/", "numpy/", "loop.py:__next__")),
    ("learning-rate schedule", ("megatron/config/learning_rates.py", "loop.py:set_learning_rate")),
    ("non-finite guard and loss scaling", ("nonfinite_step_guard.py", "training/divergence.py",
                                           "deepspeed/runtime/fp16/", "exit_requests.py")),
    ("clipping and gradient norm", ("loop.py:__call__", "torch/nn/utils/clip_grad.py", "megatron/training/metrics.py",
                                    "deepspeed/runtime/utils.py")),
    ("logging and metrics", ("megatron/training/metrics_log.py", "megatron/training/log_lines.py",
                             "megatron/training/flops.py", "megatron/training/tensorboard_log.py", "logging/",
                             "deepspeed/utils/timer.py", "deepspeed/utils/logging.py", "deepspeed/monitor/")),
    ("ZeRO bookkeeping", ("deepspeed/runtime/zero/",)),
    ("pipeline schedule", ("deepspeed/runtime/pipe/",)),
    ("DeepSpeed engine wrappers", ("deepspeed/",)),
    ("communication", ("torch/distributed/",)),
    ("optimizer math", ("torch/optim/",)),
    ("model forward+backward", ("megatron/model/", "megatron/tensor_parallel/", "torch/nn/", "torch/autograd/",
                                "torch/_tensor.py", "torch/functional.py", "reference_gpt", "bare_loop.py")),
    ("training loop", ("megatron/",)),
)
OTHER = "other Python (stdlib, hooks, contextlib)"
CATEGORIES = tuple(name for name, _ in _FILE_RULES) + (HOST_READS, OTHER)
_READS = ("item", "tolist", "__bool__", "__float__", "__int__", "cpu")


def _category_of_python(filename: str, function: str) -> str:
    where = f"{filename.replace(chr(92), '/')}:{function}"
    for name, fragments in _FILE_RULES:
        if any(fragment in where for fragment in fragments):
            return name
    return OTHER


def _is_builtin(key: tuple) -> bool:
    return key[0] == "~"


def _is_host_read(key: tuple) -> bool:
    return any(f"method '{read}' of 'torch._C" in key[2] for read in _READS)


def breakdown(stats: pstats.Stats) -> dict:
    """Seconds of the profile in each of CATEGORIES (they sum to the profile's total time)."""
    totals = dict.fromkeys(CATEGORIES, 0.0)
    for key, (_, _, own, _, callers) in stats.stats.items():
        if not _is_builtin(key):
            totals[_category_of_python(key[0], key[2])] += own
        elif _is_host_read(key):
            totals[HOST_READS] += own
        elif callers:
            for caller, edge in callers.items():  # edge: (calls, primitive calls, own time, cumulative time)
                totals[OTHER if _is_builtin(caller) else _category_of_python(caller[0], caller[2])] += edge[2]
        else:
            totals[OTHER] += own
    return totals


def _where(key: tuple, root: str) -> str:
    """A function's place as file:line (the path from `root` on) and its name."""
    path = key[0].replace(chr(92), "/")
    return f"{path[path.find(root):] if root in path else path}:{key[1]} {key[2]}"


def functions_in(stats: pstats.Stats, root: str, top: int) -> list:
    """The `top` functions whose file lies under `root` (a path fragment, e.g. "deepspeed/") by seconds of their
    own: their own time plus that of the built-ins they call directly (the operators and C methods they run),
    as (file:line name, seconds), largest first: where a category of breakdown() spends its time."""
    totals: dict = {}
    for key, (_, _, own, _, callers) in stats.stats.items():
        if not _is_builtin(key):
            if root in key[0].replace(chr(92), "/"):
                totals[key] = totals.get(key, 0.0) + own
            continue
        for caller, edge in callers.items():
            if not _is_builtin(caller) and root in caller[0].replace(chr(92), "/"):
                totals[caller] = totals.get(caller, 0.0) + edge[2]
    ranked = sorted(totals.items(), key=lambda item: -item[1])[:top]
    return [(_where(key, root), seconds) for key, seconds in ranked]


def minor_page_faults() -> int:
    """This process's minor page faults so far."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


class GarbageCollectorClock:
    """Seconds Python's cyclic garbage collector ran while started (cProfile charges them to whichever function
    happened to allocate, so they are counted apart too)."""

    def __init__(self):
        self.seconds, self._began = 0.0, None

    def _note(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        elif self._began is not None:
            self.seconds += time.perf_counter() - self._began
            self._began = None

    def start(self) -> None:
        gc.callbacks.append(self._note)

    def stop(self) -> None:
        gc.callbacks.remove(self._note)


class IterationWindow(logging.Handler):
    """A logging handler that reads the trainer's iteration lines: the elapsed time of each logged interval,
    and a cProfile recording from the iteration line numbered `start` (1-based) to the one numbered `stop`."""

    def __init__(self, start: int, stop: int):
        super().__init__()
        self.start, self.stop = start, stop
        self.elapsed_ms: list = []  # per logged interval, as the lines say
        # CPU time of this process per iteration between consecutive lines (one fewer than elapsed_ms): on a
        # machine shared with other jobs it counts this process's work, not the time others held the cores.
        self.cpu_ms: list = []
        # Minor page faults per iteration, likewise: each is a fresh page's first touch (a large buffer allocated
        # anew each step pays one per 4 KiB), which a CPU profile spreads over the operators that wrote it.
        self.page_faults: list = []
        self._last_cpu: Optional[tuple] = None  # (iteration, process time, minor faults) at the last line
        self.profile = cProfile.Profile()
        self.collector = GarbageCollectorClock()

    def emit(self, record: logging.LogRecord) -> None:
        for line in parse_log(record.getMessage()).iterations:
            now, faults = time.process_time(), minor_page_faults()
            if self._last_cpu is not None:
                iteration, before, faults_before = self._last_cpu
                self.cpu_ms.append((now - before) * 1000.0 / (line.iteration - iteration))
                self.page_faults.append((faults - faults_before) / (line.iteration - iteration))
            self._last_cpu = (line.iteration, now, faults)
            self.elapsed_ms.append(line.elapsed_ms)
            if len(self.elapsed_ms) == self.start:
                self.collector.start()
                self.profile.enable()
            elif len(self.elapsed_ms) == self.stop:
                self.profile.disable()
                self.collector.stop()

    def stats(self) -> Optional[pstats.Stats]:
        """The recorded window's statistics; None when the run logged fewer than `stop` lines."""
        if len(self.elapsed_ms) < self.stop:
            return None
        return pstats.Stats(self.profile)


def record_training(train: Callable[[], object], start: int, stop: int) -> IterationWindow:
    """Run `train` (a pretrain call) with an IterationWindow on the `megatron` logger."""
    window = IterationWindow(start, stop)
    logger = logging.getLogger("megatron")
    logger.addHandler(window)
    try:
        train()
    finally:
        logger.removeHandler(window)
    return window


def profile_calls(step: Callable[[], None], iterations: int) -> tuple:
    """cProfile over `iterations` calls of `step` (a bare loop's iteration): its statistics and the garbage
    collector's seconds."""
    profile, collector = cProfile.Profile(), GarbageCollectorClock()
    collector.start()
    profile.enable()
    for _ in range(iterations):
        step()
    profile.disable()
    collector.stop()
    return pstats.Stats(profile), collector.seconds
