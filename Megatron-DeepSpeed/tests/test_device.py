"""megatron.device on a CPU machine (the CI machine): names, seeding, dtypes, memory figures."""
import random

import numpy
import pytest
import torch
from deepspeed.accelerator import get_accelerator, set_accelerator
from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

from megatron import device
from megatron.errors import InputError

on_cpu_only = pytest.mark.skipif(device.device_name() != "cpu", reason="expectations for a CPU-only machine")


def test_accelerator_is_deepspeeds():
    from deepspeed.accelerator.abstract_accelerator import DeepSpeedAccelerator
    assert isinstance(device.accelerator(), DeepSpeedAccelerator)


@on_cpu_only
def test_cpu_names_and_backend():
    assert device.device_name() == "cpu"
    assert device.communication_backend() == "gloo"
    assert device.current_device() == torch.device("cpu")


@on_cpu_only
def test_fp16_refused_on_cpu_but_fp32_and_bf16_allowed():
    assert device.supports_dtype(torch.float16) is False
    assert device.supports_dtype(torch.float32) is True
    assert device.supports_dtype(torch.bfloat16) is True


def draws():
    return random.random(), numpy.random.rand(3).tolist(), torch.rand(3).tolist()


def test_manual_seed_repeats_every_generator():
    device.manual_seed(1234)
    first = draws()
    device.manual_seed(1234)
    assert draws() == first
    device.manual_seed(4321)
    other = draws()
    for a, b in zip(first, other):  # each of the three generators was reseeded, not just one
        assert a != b


@on_cpu_only
def test_memory_stats_report_process_memory_on_cpu():
    stats = device.memory_stats()
    assert set(stats) == {"allocated_bytes", "peak_allocated_bytes", "reserved_bytes", "peak_reserved_bytes"}
    assert stats["allocated_bytes"] > 1_000_000  # a Python process with torch holds far more than 1 MB
    assert stats["peak_allocated_bytes"] >= stats["allocated_bytes"]
    assert stats["peak_reserved_bytes"] >= stats["reserved_bytes"] > 1_000_000


def test_synchronize_returns():
    assert device.synchronize() is None


def test_local_rank_from_environment(monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert device.local_rank() == 0
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert device.local_rank() == 3


def test_bad_local_rank_is_an_input_error(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "three")
    with pytest.raises(InputError, match="LOCAL_RANK='three'"):
        device.current_device()


class NpuWithoutTritonAscend(CPU_Accelerator):
    """DeepSpeed's NPU accelerator where torch_npu is installed without triton-ascend: torch_npu then registers no
    inductor backend for npu (torch_npu/_inductor), as in this process, where nothing registers one."""

    def device_name(self, device_index=None):
        return "npu"


def test_torch_compile_is_refused_in_one_line_where_inductor_cannot_compile_for_the_device():
    device.refuse_compile_if_unavailable()  # the CPU has inductor's C++ backend
    previous = get_accelerator()
    set_accelerator(NpuWithoutTritonAscend())
    try:
        with pytest.raises(InputError, match=r"^--torch-compile: torch.compile's inductor has no code generator for "
                                             r"npu here \(torch_npu registers one only where triton-ascend is "
                                             r"installed\); install triton-ascend"):
            device.refuse_compile_if_unavailable()
    finally:
        set_accelerator(previous)
