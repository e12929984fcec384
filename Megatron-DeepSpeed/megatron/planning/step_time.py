"""Estimated seconds per training iteration of a layout: a simple model for ranking layouts, not a prediction
to the millisecond.

    compute   Megatron's FLOPs of the iteration (megatron/training/flops.py; 4 passes under recompute; an MoE
              model's on its active parameters, the top-k experts a token uses) over devices x peak x the stated
              utilisation, stretched by the pipeline bubble (1 + (PP - 1) / m for m micro-batches per step)
    TP        per micro-batch and layer, 4 all-reduces of the s b h activations (2 forward, 2 backward; 2 more
              under recompute; sequence parallelism's all-gathers and reduce-scatters move the same bytes), each
              2 (t - 1) / t of the tensor per device
    PP        per micro-batch, the s b h activations (/ t with SP) sent forward and their gradient back
    DP        the gradients' all-reduce (ZeRO 1-2: reduce-scatter plus all-gather, the same bytes; ZeRO-3 1.5x);
              experts' gradients over their expert-data-parallel group (DP / EP ranks, EP x TP apart)
    EP        per micro-batch and MoE layer, 4 all-to-alls of the dispatch buffer (2 forward, 2 backward; 2 more
              under recompute), each sending (EP - 1) / EP of it (planning/moe.py); EP groups are consecutive
              data-parallel ranks
Communication is not assumed to overlap compute (an upper bound). A group runs at the intra-node bandwidth
when its ranks share a node and at the inter-node bandwidth otherwise; TP is the innermost axis, then DP, then
PP (docs/ARCHITECTURE.md, Rank layout).
"""
from dataclasses import asdict, dataclass

from megatron.planning import moe
from megatron.planning.shape import (Layout, ModelShape, TrainingSettings, layers_per_stage, stage_expert_parameters,
                                     stage_parameters)
from megatron.training.flops import LayerMatrices, flops_per_iteration


@dataclass(frozen=True)
class Hardware:
    devices_per_node: int
    peak_tflops: float = 989.4  # H100 SXM, dense bf16
    utilization: float = 0.40  # of the peak, for the compute
    intra_node_gbps: float = 150.0  # GB/s per device achieved by collectives within a node (NVLink class)
    inter_node_gbps: float = 25.0  # GB/s per device across nodes (one 200 Gb/s NIC per device)


@dataclass(frozen=True)
class StepTime:
    compute: float
    tensor_parallel: float
    pipeline_parallel: float
    data_parallel: float
    expert_parallel: float = 0.0
    sequence_parallel: float = 0.0  # DeepSpeed-Ulysses' all-to-alls

    @property
    def total(self) -> float:
        return (self.compute + self.tensor_parallel + self.pipeline_parallel + self.data_parallel
                + self.expert_parallel + self.sequence_parallel)

    def as_dict(self) -> dict:
        return {**asdict(self), "total": self.total}


def _bandwidth(group_size: int, stride: int, hardware: Hardware) -> float:
    """Bytes per second of a group whose ranks are `stride` apart."""
    within_node = group_size * stride <= hardware.devices_per_node
    return 1e9 * (hardware.intra_node_gbps if within_node else hardware.inter_node_gbps)


def _all_reduce_bytes(size: float, ranks: int) -> float:
    return 2 * (ranks - 1) / ranks * size


def estimate_step_time(shape: ModelShape, layout: Layout, settings: TrainingSettings,
                       hardware: Hardware) -> StepTime:
    t, p, d, ep = layout.tensor, layout.pipeline, layout.data, layout.expert_parallel
    micro_batches = settings.global_batch_size // (layout.micro_batch * d)
    flops = flops_per_iteration(settings.global_batch_size, shape.seq_length, shape.num_layers, shape.hidden_size,
                                shape.padded_vocab(t), layout.recompute, shape.moe if shape.has_experts else None,
                                LayerMatrices.of(shape))
    compute = flops / (layout.devices * hardware.peak_tflops * 1e12 * hardware.utilization)
    compute *= 1 + (p - 1) / micro_batches
    activation = shape.seq_length * layout.micro_batch * shape.hidden_size * settings.dtype_bytes
    layers = layers_per_stage(shape.num_layers, p)
    collectives = micro_batches * layers * (6 if layout.recompute else 4)
    tensor = collectives * _all_reduce_bytes(activation, t) / _bandwidth(t, 1, hardware) if t > 1 else 0.0
    sent = activation / (t if layout.sequence_parallel else 1)
    pipeline = micro_batches * 2 * sent / _bandwidth(p, t * d, hardware) if p > 1 else 0.0
    experts = stage_expert_parameters(shape, ep, t)
    gradients = max(stage_parameters(shape, t, p, stage, settings.pipeline_engine, ep) for stage in (0, p - 1))
    reduced_over = d * layout.ulysses  # Ulysses ranks hold whole weights: their gradients are reduced too
    volume = _all_reduce_bytes((gradients - experts) * settings.dtype_bytes, reduced_over) * (
        1.5 if layout.zero_stage == 3 else 1)
    data = volume / _bandwidth(reduced_over, t, hardware) if reduced_over > 1 else 0.0
    if experts and d // ep > 1:
        data += _all_reduce_bytes(experts * settings.dtype_bytes, d // ep) / _bandwidth(d // ep, t * ep, hardware)
    all_to_alls = micro_batches * (6 if layout.recompute else 4) * sum(
        moe.all_to_all_bytes(shape, layout, settings, count) for count in shape.moe_layer_experts())
    expert = all_to_alls / _bandwidth(ep, t, hardware) if ep > 1 else 0.0
    return StepTime(compute, tensor, pipeline, data, expert, ulysses_all_to_all(shape, layout, settings, hardware,
                                                                                micro_batches))


def ulysses_all_to_all(shape: ModelShape, layout: Layout, settings: TrainingSettings, hardware: Hardware,
                       micro_batches: int) -> float:
    """DeepSpeed-Ulysses: per layer and micro-batch, all-to-alls of q, k, v and the context forward and of their
    gradients backward (again in a recomputed forward), each sending (SP - 1) / SP of this rank's s/SP x h
    chunk (k and v at the key/value heads' width)."""
    sp = layout.ulysses
    if sp == 1:
        return 0.0
    chunk = shape.seq_length * layout.micro_batch / sp * shape.hidden_size * settings.dtype_bytes * (sp - 1) / sp
    tensors = 2 + 2 * shape.key_value_heads / shape.num_attention_heads  # q and context, k and v
    passes = 3 if layout.recompute else 2
    return (micro_batches * layers_per_stage(shape.num_layers, layout.pipeline) * passes * tensors * chunk
            / _bandwidth(sp, layout.tensor, hardware))
