"""The layout planner against the real training step: live-tensor bytes counted on the CPU
(tools/benchmarks/live_memory.py) while pretrain_gpt.py trains, per layout, beside the planner's estimate for the
same flags (tools/benchmark_planner_memory.py)."""
import argparse

import pytest
import torch

from megatron.model.cross_entropy import CHUNK_BYTES
from megatron.planning.shape import ACCELERATOR_LOSS_CHUNK_BYTES, DEEPSPEED_REDUCE_BUCKET
from tests.helpers.distributed import run_on_ranks
from tools.benchmarks.live_memory import LiveTensorBytes, record_iteration_peaks


def test_live_bytes_count_each_storage_once_until_it_is_freed():
    with LiveTensorBytes() as live:
        kept = torch.empty(1000, dtype=torch.float32)
        view = kept[10:20].view(2, 5)  # same storage: no more bytes
        temporary = torch.ones(500, dtype=torch.bfloat16)
        assert live.now == 4000 + 1000 and view.numel() == 10
        del temporary
        torch.empty(10, device="meta")  # holds no memory
        assert live.now == 4000 and live.take_peak() == 5000 and live.peak == 4000


def test_iteration_peaks_split_at_the_first_forward_and_the_optimizer_step():
    model = torch.nn.Linear(256, 256)  # built before the count: not counted
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def train():
        for _ in range(2):
            model(torch.randn(64, 256)).square().sum().backward()  # input 64 KiB, gradients 257 KiB
            optimizer.step()
            optimizer.zero_grad()

    peaks = record_iteration_peaks(train)
    weights = 256 * 257 * 4
    assert len(peaks.forward_backward) == len(peaks.optimizer_step) == 2
    assert peaks.start_up == 64 * 256 * 4  # the first input, made before the first forward
    assert peaks.forward_backward[0] >= weights  # the gradients
    assert peaks.optimizer_step[1] >= 2 * weights  # the momentum buffers, and the gradients still held


def test_the_planners_constants_are_the_model_and_deepspeeds():
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    assert ACCELERATOR_LOSS_CHUNK_BYTES == CHUNK_BYTES
    assert DEEPSPEED_REDUCE_BUCKET == DeepSpeedZeroConfig().reduce_bucket_size


def forked(options, layout: str) -> dict:
    """The benchmark's figures with the layout's ranks forked from the suite's preloaded server
    (tests/helpers/distributed.py) instead of started as a torchrun job: no fresh interpreter per cell."""
    from tools.benchmark_planner_memory import LAYOUTS, figures, heaviest_peaks
    return figures(options, layout, run_on_ranks(heaviest_peaks, LAYOUTS[layout][0], options, layout, timeout=600)[0])


def as_the_benchmark_runs_it(options, layout: str) -> dict:
    from tools.benchmark_planner_memory import measure
    return measure(options, layout)


@pytest.mark.full
@pytest.mark.parametrize("layout, bucket, micro_batches, launch", [
    ("zero1", None, 1, forked), ("pipeline", None, 1, forked), ("zero3", 100_000, 1, as_the_benchmark_runs_it),
    ("tp2", 100_000, 1, forked), ("pp2", 100_000, 1, forked), ("no-recompute", 100_000, 2, forked)])
def test_the_planner_is_within_15_percent_of_the_real_steps_peak(layout, bucket, micro_batches, launch):
    """bf16, the tiny preset with one device's layout changed: with the trainer's reduce bucket (the rank's parameter
    count: DeepSpeed's default of 5e8 elements would dominate) and a smaller one, where the activations and logits
    do (and with two micro-batches the first one's gradients). One cell runs as tools/benchmark_planner_memory.py
    runs every layout, a torchrun job."""
    options = argparse.Namespace(model_size="tiny", num_layers=None, micro_batch_size=2, micro_batches=micro_batches,
                                 iterations=2, dtype="bf16", zero_reduce_bucket_size=bucket)
    figures = launch(options, layout)
    assert figures["estimate"]["bytes"] == pytest.approx(figures["measured"]["peak"][-1], rel=0.15)
