"""The layouts a job can run with on N devices, each with its memory and step-time estimates, ranked: the ones
that fit first, fastest first. Also the check the entry scripts make before they start a job."""
import itertools
from dataclasses import dataclass, replace
from typing import Optional

from megatron.errors import InputError
from megatron.planning.memory import FRAGMENTATION, PHASES, MemoryEstimate, estimate_memory
from megatron.planning.shape import Layout, ModelShape, TrainingSettings
from megatron.planning.step_time import Hardware, StepTime, estimate_step_time

GIB = 1 << 30
MOE_NO_PIPELINE = ("mixture-of-experts runs on DeepSpeed's plain engine (--no-pipeline-parallel), so layouts with "
                   "PP > 1 are left out")


@dataclass(frozen=True)
class Plan:
    layout: Layout
    memory: MemoryEstimate
    step_time: StepTime
    fits: bool

    def samples_per_second(self, settings: TrainingSettings) -> float:
        return settings.global_batch_size / self.step_time.total

    def as_dict(self, settings: TrainingSettings) -> dict:
        plain_engine = self.layout.zero_stage >= 2 or not settings.pipeline_engine
        return {"layout": vars(self.layout) | {"no_pipeline_parallel": plain_engine},
                "memory_bytes": self.memory.as_dict(), "step_seconds": self.step_time.as_dict(), "fits": self.fits,
                "samples_per_second": self.samples_per_second(settings)}


def _divisors(n: int) -> list:
    return [k for k in range(1, n + 1) if n % k == 0]


def expert_parallel_sizes(shape: ModelShape, data: int, fixed: Optional[int] = None) -> list:
    """EP sizes of an MoE model at data-parallel size `data`: divisors of DP that divide every MoE layer's expert
    count (each rank holds experts / EP of each), or only `fixed` where the user gave one; [1] when dense."""
    if not shape.has_experts:
        return [1]
    return [ep for ep in _divisors(data) if (fixed is None or ep == fixed)
            and all(count % ep == 0 for count in shape.moe_layer_experts())]


def candidate_layouts(shape: ModelShape, settings: TrainingSettings, devices: int, devices_per_node: int,
                      expert_parallel: Optional[int] = None):
    """Every layout the trainer accepts: TP within a node and dividing the heads and the FFN; PP up to the layer
    count; the global batch a multiple of micro-batch x DP; ZeRO 2-3 only on the plain engine (PP 1, DP > 1);
    sequence parallelism with TP > 1 and ZeRO 0-1. With experts (config/flags/moe.py's rules): PP 1, no
    sequence parallelism, ZeRO 0-2, and each EP size of expert_parallel_sizes. DeepSpeed-Ulysses sizes where the
    trainer takes them (parallelism._check_ulysses): TP 1, PP 1, the plain engine, dense, dividing the heads, the
    key/value heads and the sequence."""
    for ulysses in ulysses_sizes(shape, settings, devices):
        for layout in _layouts(shape, settings, devices // ulysses, devices_per_node, expert_parallel):
            if ulysses == 1 or (layout.tensor, layout.pipeline) == (1, 1):
                yield layout if ulysses == 1 else replace(layout, ulysses=ulysses)


def ulysses_sizes(shape: ModelShape, settings: TrainingSettings, devices: int) -> list:
    if settings.pipeline_engine or shape.has_experts:
        return [1]
    return [sp for sp in _divisors(devices) if not (shape.num_attention_heads % sp or shape.key_value_heads % sp
                                                    or shape.seq_length % sp)]


def _layouts(shape: ModelShape, settings: TrainingSettings, devices: int, devices_per_node: int,
             expert_parallel: Optional[int]):
    experts = shape.has_experts
    for tensor in _divisors(devices):
        if tensor > devices_per_node or shape.num_attention_heads % tensor or shape.ffn % tensor:
            continue
        for pipeline in _divisors(devices // tensor):
            if pipeline > shape.num_layers or (pipeline > 1 and (experts or not settings.pipeline_engine)):
                continue
            data = devices // (tensor * pipeline)
            if settings.global_batch_size % data:
                continue
            zero_stages = (0, 1) + (((2,) if experts else (2, 3)) if pipeline == 1 and data > 1 else ())
            for micro_batch, zero, recompute, ep in itertools.product(
                    _divisors(settings.global_batch_size // data), zero_stages, (False, True),
                    expert_parallel_sizes(shape, data, expert_parallel)):
                for sequence_parallel in ((False, True) if tensor > 1 and zero <= 1 and not experts else (False,)):
                    yield Layout(tensor, pipeline, data, zero, micro_batch, recompute, sequence_parallel, ep)


def plan(shape: ModelShape, layout: Layout, settings: TrainingSettings, hardware: Hardware,
         device_memory: float, fragmentation: float = FRAGMENTATION) -> Plan:
    memory = estimate_memory(shape, layout, settings, fragmentation)
    return Plan(layout, memory, estimate_step_time(shape, layout, settings, hardware), memory.total <= device_memory)


def ranked_plans(shape: ModelShape, settings: TrainingSettings, devices: int, hardware: Hardware,
                 device_memory: float, fragmentation: float = FRAGMENTATION,
                 expert_parallel: Optional[int] = None) -> list:
    """Every candidate layout's plan (an MoE model's at `expert_parallel` only, where given): those that fit,
    fastest first (at equal time the larger micro-batch, which the step-time model does not reward but real
    kernels do, then the smaller memory), then the others, smallest first."""
    plans = [plan(shape, layout, settings, hardware, device_memory, fragmentation)
             for layout in candidate_layouts(shape, settings, devices, hardware.devices_per_node, expert_parallel)]
    return sorted(plans, key=lambda p: (not p.fits, round(p.step_time.total, 4) if p.fits else 0,
                                        -p.layout.micro_batch if p.fits else 0, p.memory.total))


def describe(memory: MemoryEstimate) -> str:
    """One line: the total and each term of the peak phase, in GiB (MiB for a model under 1 GiB)."""
    unit, size = ("GiB", GIB) if memory.total >= GIB else ("MiB", 1 << 20)
    terms = ", ".join(f"{term.replace('_', ' ')} {getattr(memory, term) / size:.2f}"
                      for term in (*PHASES[memory.peak_phase], "fragmentation") if getattr(memory, term))
    return (f"{memory.total / size:.2f} {unit} per device at its peak ({memory.peak_phase}, stage {memory.stage}): "
            f"{terms}")


def require_fit(memory: MemoryEstimate, device_memory: float, override_flag: str) -> None:
    """InputError naming the largest term when the estimate exceeds the device's memory."""
    if memory.total > device_memory:
        largest = memory.largest_term()
        raise InputError(f"this layout needs about {memory.total / GIB:.1f} GiB per device but a device has "
                         f"{device_memory / GIB:.1f} GiB; the largest term is {largest.replace('_', ' ')} "
                         f"({getattr(memory, largest) / GIB:.1f} GiB): try tools/plan_layout.py for a layout "
                         f"that fits, or {override_flag} to start anyway")
