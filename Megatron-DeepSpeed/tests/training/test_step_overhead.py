"""step_overhead: cProfile time sorted into the kinds of work a step does, and a window of whole logged
iterations opened and closed by the trainer's own iteration lines."""
import gc
import logging
import mmap

import pytest
import torch

from tools.benchmarks import bare_loop, step_overhead
from megatron.training.log_lines import iteration_line

# Functions whose code claims to live in the trainer's data package and in DeepSpeed's ZeRO, so that the
# profile sorts them by those paths.
DATA_CODE = "def build(n):\n    return torch.ones(n, n) @ torch.ones(n, n)\n"
ZERO_CODE = "def bookkeeping(t):\n    return float(t.sum().item())\n"


def function_in(path: str, code: str, name: str):
    scope = {"torch": torch}
    exec(compile(code, path, "exec"), scope)
    return scope[name]


def test_time_goes_to_the_category_of_the_file_and_reads_to_their_own():
    build = function_in("/site/megatron/data/fake_loader.py", DATA_CODE, "build")
    bookkeeping = function_in("/site/deepspeed/runtime/zero/fake_stage.py", ZERO_CODE, "bookkeeping")

    def step():
        bookkeeping(build(200))

    stats, _ = step_overhead.profile_calls(step, 5)
    totals = step_overhead.breakdown(stats)
    assert set(totals) == set(step_overhead.CATEGORIES)
    assert totals["data loader and batch building"] > 0  # the matrix product, a built-in called from there
    assert totals["ZeRO bookkeeping"] > 0 and totals[step_overhead.HOST_READS] > 0
    assert totals["DeepSpeed engine wrappers"] == 0 and totals["model forward+backward"] == 0
    assert sum(totals.values()) == pytest.approx(stats.total_tt, rel=1e-6)


def line(iteration, elapsed_ms):
    return iteration_line(iteration, 10, 4 * iteration, elapsed_ms, 1e-4, 4, 2.0, 1.0, 0.5, 0, 0, 40.0, 0.0)


def test_the_window_holds_what_runs_between_its_iteration_lines():
    marker = function_in("/site/megatron/data/marker.py", "def marker():\n    return 1\n", "marker")
    logger = logging.getLogger("megatron.test_step_overhead")
    logger.setLevel(logging.INFO)

    def train():
        for iteration, elapsed in enumerate((30.0, 20.0, 25.0, 24.0), start=1):
            for _ in range(iteration):  # 1, 2, 3, 4 calls before each line
                marker()
            logger.info(line(iteration, elapsed))
            logger.info("not an iteration line")

    window = step_overhead.record_training(train, start=2, stop=3)
    assert window.elapsed_ms == [30.0, 20.0, 25.0, 24.0]
    assert len(window.cpu_ms) == 3 and min(window.cpu_ms) >= 0  # per iteration between consecutive lines
    assert len(window.page_faults) == 3 and min(window.page_faults) >= 0
    calls = {key[2]: counts[1] for key, counts in window.stats().stats.items()}
    assert calls["marker"] == 3  # only those between the second and the third line
    assert step_overhead.IterationWindow(2, 5).stats() is None  # a run that logged too few lines


def test_the_garbage_collector_clock_counts_collections_while_started():
    clock = step_overhead.GarbageCollectorClock()
    gc.collect()
    assert clock.seconds == 0.0
    clock.start()
    gc.collect()
    clock.stop()
    measured = clock.seconds
    gc.collect()
    assert measured > 0 and clock.seconds == measured


def test_functions_under_a_root_are_ranked_by_their_own_time_with_the_builtins_they_call():
    bookkeeping = function_in("/site/deepspeed/runtime/zero/fake_stage.py", ZERO_CODE, "bookkeeping")
    build = function_in("/site/megatron/data/fake_loader.py", DATA_CODE, "build")

    def step():
        bookkeeping(build(200))

    stats, _ = step_overhead.profile_calls(step, 5)
    ranked = step_overhead.functions_in(stats, "deepspeed/", top=5)
    assert [where for where, _ in ranked] == ["deepspeed/runtime/zero/fake_stage.py:1 bookkeeping"]
    own = next(counts[2] for key, counts in stats.stats.items() if key[2] == "bookkeeping")
    assert ranked[0][1] > own  # the .sum() and .item() it calls are counted to it


def test_page_faults_count_the_first_touch_of_fresh_memory():
    pages = 256

    def touch_fresh_pages():  # an anonymous mapping, new each call: every page faults when first written
        with mmap.mmap(-1, pages * mmap.PAGESIZE) as fresh:
            for page in range(pages):
                fresh[page * mmap.PAGESIZE] = 1

    _, _, faults = bare_loop.interval_means_ms(touch_fresh_pages, intervals=2, interval=3)
    assert len(faults) == 2 and min(faults) >= pages
