"""The one place that knows which accelerator we run on (cpu / cuda / npu).

Everything goes through DeepSpeed's accelerator abstraction, so the rest of the code base never names a
device-specific torch module and runs unchanged on GPUs, Ascend NPUs and plain CPUs. DeepSpeed is imported
inside the functions because importing it is slow and most importers of this module only need it later.
"""
import os
import random
from typing import Optional

import numpy
import torch

from megatron.errors import InputError


def accelerator():
    """DeepSpeed's accelerator object for this machine (chosen by DeepSpeed, or by DS_ACCELERATOR)."""
    from deepspeed.accelerator import get_accelerator
    return get_accelerator()


def device_name() -> str:
    """'cpu', 'cuda' or 'npu': the key kernels and dtype checks are chosen by."""
    return accelerator().device_name()


def device_model_name() -> str:
    """The model of this process's accelerator as its driver names it (e.g. "NVIDIA H100 80GB HBM3",
    "Ascend910B3"), for looking up its peak FLOP/s; "cpu" on the CPU."""
    name = device_name()
    backend = getattr(torch, name, None)  # torch.cuda, torch.npu (registered by torch_npu), torch.xpu
    if name == "cpu" or backend is None or not hasattr(backend, "get_device_name"):
        return name
    return backend.get_device_name(local_rank())


def local_rank() -> int:
    """This process's index on its node, as set by torchrun or the deepspeed launcher (0 when run alone)."""
    value = os.environ.get("LOCAL_RANK", "0")
    try:
        return int(value)
    except ValueError:
        raise InputError(f"environment variable LOCAL_RANK={value!r} is not an integer; "
                         "unset it or let torchrun / the deepspeed launcher set it") from None


def use_local_rank_flag(flag_value) -> None:
    """Honour `--local_rank N` / `--local-rank N`, which the deepspeed launcher (and torch.distributed.launch)
    pass on the command line: it becomes LOCAL_RANK when the environment lacks one; a contradiction is an
    error. None (flag absent) changes nothing."""
    if flag_value is None:
        return
    if "LOCAL_RANK" in os.environ and local_rank() != flag_value:
        raise InputError(f"--local_rank {flag_value} contradicts environment variable LOCAL_RANK={local_rank()}; "
                         "launch through one launcher, which sets both the same")
    os.environ["LOCAL_RANK"] = str(flag_value)


def bind_local_device() -> None:
    """Make accelerator LOCAL_RANK this process's current device. Must run before the first collective and before
    any tensor is made on the accelerator: nccl and hccl build a rank's communicator on the current device, and
    torch.distributed puts object collectives (broadcast_object_list) there, which is device 0 in every rank until
    something binds it; DeepSpeed's engine binds LOCAL_RANK only when it is built, long after. A no-op on CPU."""
    accelerator().set_device(local_rank())


def device_count() -> int:
    """Accelerators visible to this process (DeepSpeed's count; not meaningful on CPU)."""
    return accelerator().device_count()


def current_device() -> torch.device:
    """The device this process's tensors belong on: accelerator number LOCAL_RANK, or the CPU."""
    return torch.device(accelerator().device_name(local_rank()))


def communication_backend() -> str:
    """torch.distributed backend that matches the device: 'nccl', 'hccl', or 'gloo' on CPU."""
    return accelerator().communication_backend_name()


def manual_seed(seed: int) -> None:
    """Seed every random generator a training run draws from, so a run with the same seed repeats exactly."""
    random.seed(seed)
    numpy.random.seed(seed)
    torch.manual_seed(seed)
    accelerator().manual_seed_all(seed)


def synchronize() -> None:
    """Wait for queued device work, so wall-clock timings measure the work and not just its launch."""
    accelerator().synchronize()


def memory_stats() -> dict:
    """Bytes in use now and the peak, as {'allocated_bytes', 'peak_allocated_bytes'}, and what the allocator holds
    ({'reserved_bytes', 'peak_reserved_bytes'}).

    On GPU/NPU these are the caching allocator's figures for tensors. On CPU there is no allocator to ask,
    so both are the process's resident set size (RSS, via psutil): the peak is the largest RSS DeepSpeed has
    sampled so far, i.e. only as fine-grained as the calls that sample it.
    """
    accel = accelerator()
    return {"allocated_bytes": accel.memory_allocated(), "peak_allocated_bytes": accel.max_memory_allocated(),
            "reserved_bytes": accel.memory_reserved(), "peak_reserved_bytes": accel.max_memory_reserved()}


def total_memory():
    """Bytes of memory of one device, for checking a layout before a job starts; None on the CPU, whose memory
    every rank shares with the rest of the host."""
    if device_name() == "cpu":
        return None
    return accelerator().total_memory(0)


def reset_peak_memory() -> None:
    """Start a new peak for memory_stats (a no-op where the accelerator keeps none, e.g. on CPU)."""
    accelerator().reset_peak_memory_stats()


def profiler_activities() -> list:
    """What torch.profiler records here: host work, plus this device's kernels where torch's profiler has an
    activity for it (CUDA; an adaptor's own profiler covers NPUs)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device_name() == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return activities


def bf16_supported() -> bool:
    """The device's own answer (e.g. torch_npu's is_bf16_supported(), False below Ascend910B1), not DeepSpeed's
    list of dtypes, which names bf16 for every NPU; DeepSpeed's engine refuses bf16 by this same answer."""
    return bool(accelerator().is_bf16_supported())


def refuse_bf16_if_unsupported() -> None:
    """--bf16 on a device without bf16 (e.g. a first-generation Ascend 910): one line now, instead of DeepSpeed's
    ValueError when the engine starts."""
    if bf16_supported():
        return
    if fp16_overflow_visible():
        raise InputError(f"--bf16: this {device_name()} reports no bf16 support; use --fp16 (dynamic loss scaling) "
                         "or neither flag for fp32")
    raise InputError(f"--bf16: this {device_name()} reports no bf16 support (torch_npu: chips below Ascend910B1); "
                     "leave it off to train in fp32 (--fp16 is refused too: this device's fp16 saturates on overflow)")


def fp16_overflow_visible() -> bool:
    """Whether an fp16 overflow shows up as inf/NaN, the only sign DeepSpeed's loss scaler looks for. NPUs in
    saturation mode (torch_npu's is_support_inf_nan() False: chips below Ascend910B1) clamp an overflow to the
    largest finite value instead, so an overflowing step would look finite and the loss scale would never drop.
    A torch_npu without the query is judged by the chip generation, which bf16 support also marks."""
    if device_name() != "npu":
        return True
    is_support_inf_nan = getattr(torch.npu.utils, "is_support_inf_nan", None)
    return bool(is_support_inf_nan()) if is_support_inf_nan is not None else bf16_supported()


def refuse_fp16_if_overflow_invisible() -> None:
    """--fp16 on an NPU in saturation mode: one line, instead of loss scaling that cannot see an overflow."""
    if not fp16_overflow_visible():
        raise InputError(f"--fp16: this {device_name()} saturates on fp16 overflow instead of producing inf/NaN "
                         "(torch_npu is_support_inf_nan() is False, chips below Ascend910B1), so dynamic loss "
                         "scaling cannot see an overflow; train in fp32 (leave --fp16 off) or on an Ascend910B chip "
                         "with --bf16")


def compile_unavailable() -> Optional[str]:
    """Why torch.compile's inductor cannot compile for this device, or None when it can. Inductor generates code
    only for device types with a registered backend (its scheduler fails on the first forward otherwise);
    torch_npu registers one for npu only when triton-ascend is installed (torch_npu/_inductor)."""
    from torch._inductor.codegen.common import get_scheduling_for_device, init_backend_registration
    init_backend_registration()
    name = device_name()
    if get_scheduling_for_device(name) is not None:
        return None
    needs = " (torch_npu registers one only where triton-ascend is installed)" if name == "npu" else ""
    return f"torch.compile's inductor has no code generator for {name} here{needs}"


def refuse_compile_if_unavailable() -> None:
    """--torch-compile where inductor cannot compile for the device: one line now, not a scheduler error at the
    first forward. Refused rather than run eager, so a run never measures something other than what was asked."""
    why = compile_unavailable()
    if why is not None:
        raise InputError(f"--torch-compile: {why}; install triton-ascend for your torch_npu release, or leave "
                         "--torch-compile off (eager)")


def supports_dtype(dtype: torch.dtype) -> bool:
    """Whether training in `dtype` works on this device.

    fp16 is refused on CPU even where the CPU has fp16 arithmetic: DeepSpeed's fp16 path (loss scaling)
    does not run there. Use bf16 or fp32 on CPU.
    """
    if dtype == torch.bfloat16:
        return bf16_supported()
    if device_name() == "cpu" and dtype == torch.float16:
        return False
    return dtype in accelerator().supported_dtypes()
