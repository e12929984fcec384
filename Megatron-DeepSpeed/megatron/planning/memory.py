"""Memory per device of one training layout, term by term. All figures are bytes for the heaviest pipeline stage.

The peak is the largest of three phases, as DeepSpeed 0.19.8 allocates and frees (measured on the real training
step by tools/benchmark_planner_memory.py): forward and backward (model states, activations, logits, the
gradient bucket); gradient reduction, where the pipeline engine reduces after its schedule's backward passes
(model states and two buckets); and the optimizer step (model states plus the fp32 gradients the step reads,
which exist only then).

Model states, per parameter Ψ of the rank (d = data-parallel size; ZeRO divides by d what its stage shards; an
MoE model's experts, whose optimizer groups DeepSpeed partitions over their expert-data-parallel group, by d / EP):
    weights          model dtype (2 bytes in bf16/fp16, 4 in fp32); ZeRO-3: / d
    gradients        model dtype; ZeRO-2/3: / d. In forward and backward only with gradient accumulation
                     (accumulated_gradients): a step of one micro-batch starts backward, its peak, with none
    optimizer        Adam's two fp32 moments, plus an fp32 master copy in half precision or under ZeRO >= 1
                     (DeepSpeed's partitioned optimizer keeps one); / d under ZeRO >= 1
    step_gradients   the fp32 gradients the step reads where they are a copy (half precision, or ZeRO >= 1):
                     DeepSpeed flattens its partition (/ d under ZeRO >= 1; whole under ZeRO 0); ZeRO 1 in
                     half precision first flattens it in the model dtype too, a copy alive while it converts
DeepSpeed's buffers, reduce_bucket_size elements of the model dtype each, whatever the model's size (unless the
flags size it, the trainer caps it at the rank's parameter count, training/loop.py's capped_reduce_bucket):
    buckets              ZeRO 1-2: the bucket each backward's first gradient allocates, freed before the step
    reduction_buckets    the pipeline engine at ZeRO 1-2: one more, allocated when it reduces the gradients
    kept_buffers         ZeRO-3: its bucket, kept in every phase
    kept_logits          the pipeline engine's last stage keeps the logits (their gradient by then) in its
                         output buffers through the reduction and the step
Activations (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"), per
layer and micro-batch of b sequences of s tokens, hidden h, tensor-parallel t:
    kept for backward   s b h (4 + 12 / t) values (4 / t + 12 / t with sequence parallelism): the two LayerNorm
                        inputs and the QKV and MLP inputs whole; q, k, v, the attention output and the two
                        4h-wide MLP tensors split (the paper's 34 bytes without its 2 bytes of dropout masks);
                        the Llama variants change both parts as autograd keeps them in model/gpt.py (measured on a
                        layer, tests/planning/test_layout_planner.py): torch's RMSNorm keeps its input and result in fp32 (4
                        half-precision values per norm, 2 in fp32) where LayerNorm keeps its input; attention keeps
                        the rotated q and k and, with grouped-query attention, K and V repeated to every head
                        unless the attention kernel takes them grouped (TrainingSettings.kv_repeated: the
                        kernel's own answer, model/kernels.py) (the fused QKV output only where q, k or v is
                        still a view of it); SwiGLU keeps its 2f-wide
                        gate|up, SiLU(gate) and their product (4f, GeLU's 2f);
                        plus two 1-byte dropout masks per layer when dropout is on; Megatron's unfused
                        attention adds its a s^2 b / t scores
    recompute           only each layer's input (s b h, / t with SP) is kept; one layer's activations are
                        rebuilt at a time in backward. Upstream main's block method: so for the first
                        recompute_layers layers of a stage, the others keep everything (freed in backward
                        before the first rebuild). Selective: every layer
                        keeps everything but its attention core's insides (the a s^2 b / t scores of unfused
                        attention; the fused kernel keeps none anyway); the core's inputs q, k, v stay
    pipeline in flight  DeepSpeed's 1F1B schedule keeps min(PP - stage, micro-batches) micro-batches' activations
                        on a stage; the first stage holds the most
    logits and loss     the last stage: b s V / t logits in the model dtype (backward writes their gradient
                        over them, model/gpt.py's loss) and the loss's fp32 row chunks (at most the device's
                        loss_chunk_bytes, model/kernels.py: 256 MiB on an accelerator)
    MoE layers          the attention half of a dense layer, then the gate, dispatch and combine tensors of
                        planning/moe.py in the MLP's place; plus, once, the largest MoE layer's transient
                        all-to-all buffers
    fragmentation       a stated share of the sum, for the caching allocator's rounding and free blocks
DeepSpeed pads each ZeRO 1-2 group's flat buffer to a multiple of 2 x its data-parallel size (at most 2d - 1
elements per group), which is left out.
"""
from dataclasses import asdict, dataclass

from megatron.planning import moe
from megatron.planning.shape import (DEEPSPEED_REDUCE_BUCKET, Layout, ModelShape, TrainingSettings, layers_per_stage,
                                     stage_expert_parameters, stage_parameters)

FRAGMENTATION = 0.05
STATES = ("weights", "optimizer", "kept_buffers")
FORWARD_BACKWARD = (*STATES, "accumulated_gradients", "buckets", "activations", "pipeline_in_flight",
                    "logits_and_loss")
GRADIENT_REDUCTION = (*STATES, "gradients", "buckets", "reduction_buckets", "kept_logits")
OPTIMIZER_STEP = (*STATES, "gradients", "step_gradients", "kept_logits")


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per device of the heaviest stage, by term (TERMS); `peak_phase` names the phase whose terms, plus
    fragmentation, make the total."""
    weights: float
    gradients: float
    accumulated_gradients: float
    optimizer: float
    kept_buffers: float
    buckets: float
    reduction_buckets: float
    step_gradients: float
    activations: float
    pipeline_in_flight: float
    logits_and_loss: float
    kept_logits: float
    fragmentation: float
    peak_phase: str  # a key of PHASES
    stage: int  # the pipeline stage these figures are for

    @property
    def total(self) -> float:
        return sum(getattr(self, term) for term in PHASES[self.peak_phase]) + self.fragmentation

    def largest_term(self) -> str:
        return max(PHASES[self.peak_phase], key=lambda term: getattr(self, term))

    def as_dict(self) -> dict:
        return {**asdict(self), "total": self.total}


PHASES = {"forward/backward": FORWARD_BACKWARD, "gradient reduction": GRADIENT_REDUCTION,
          "optimizer step": OPTIMIZER_STEP}


def model_state_bytes(parameters: int, layout: Layout, settings: TrainingSettings, experts: int = 0) -> dict:
    """weights, gradients, optimizer and step_gradients for `parameters` on one rank, `experts` of which belong to
    its experts (ZeRO shards those over data / expert_parallel ranks), and DeepSpeed's buckets."""
    size, half, zero = settings.dtype_bytes, settings.dtype != "fp32", layout.zero_stage
    groups = ((parameters - experts, layout.zero_partitions), (experts, layout.data // layout.expert_parallel))

    def per_rank(bytes_each: float, from_stage: int) -> float:
        return sum(bytes_each * count / (d if zero >= from_stage else 1) for count, d in groups)

    copied = half or zero >= 1  # an fp32 master copy and fp32 step gradients beside the model's own tensors
    bucket = float(size * (settings.zero_reduce_bucket_size or min(DEEPSPEED_REDUCE_BUCKET, parameters)))
    return {"weights": per_rank(size, 3), "gradients": per_rank(size, 2),
            "optimizer": per_rank(8 + (4 if copied else 0), 1),
            "step_gradients": (per_rank(4, 1) if copied else 0) + (per_rank(size, 1) if half and zero == 1 else 0),
            "buckets": bucket if zero in (1, 2) else 0.0,
            "reduction_buckets": bucket if zero in (1, 2) and settings.pipeline_engine else 0.0,
            "kept_buffers": bucket if zero == 3 else 0.0}


def layer_activation_bytes(shape: ModelShape, layout: Layout, settings: TrainingSettings,
                           layer_number: int = 1) -> float:
    """One layer, one micro-batch, everything kept for backward without recomputation. The MLP's share is its
    input and mlp_values / t of s b h values, which an MoE layer replaces by its own. Under DeepSpeed-Ulysses every
    term is 1/SP of it: a rank holds s/SP tokens, and inside attention the whole sequence of 1/SP of the heads."""
    t, sbh = layout.tensor, local_tokens(shape, layout) * shape.hidden_size
    replicated = replicated_values(shape, settings) / (t if layout.sequence_parallel else 1)
    values = sbh * (replicated + split_values(shape, settings.kv_repeated) / t)
    masks = 2 * sbh / (t if layout.sequence_parallel else 1) if settings.hidden_dropout > 0 else 0
    scores = 0 if settings.fused_attention or layout.selective_recompute else (
        shape.num_attention_heads * shape.seq_length ** 2 * layout.micro_batch / (t * layout.ulysses)
        * settings.dtype_bytes)
    experts = shape.experts_of_layer(layer_number)
    mlp = 0.0
    if experts > 1:  # no sequence parallelism with experts
        values -= sbh * (1 + mlp_values(shape) / t)
        mlp = moe.mlp_activation_bytes(shape, layout, settings, experts)
    return settings.dtype_bytes * values + masks + scores + mlp


def local_tokens(shape: ModelShape, layout: Layout) -> float:
    """Tokens of one micro-batch a rank holds between layers: the whole sequences, or 1/SP of each under Ulysses."""
    return shape.seq_length * layout.micro_batch / layout.ulysses


def replicated_values(shape: ModelShape, settings: TrainingSettings) -> float:
    """Values per s b h (in the model dtype) a layer keeps whole on each tensor-parallel rank (split along the
    sequence with SP): each norm's, then the QKV and MLP inputs (GPT-2: 1 + 1 + 1 + 1)."""
    norm = 1 if shape.normalization == "layernorm" else 2 * 4 / settings.dtype_bytes
    return 2 * norm + 2


def split_values(shape: ModelShape, kv_repeated: bool) -> float:
    """Values per s b h a layer keeps split over the tensor-parallel ranks: what attention reads (q, k, v) and
    its output, then the MLP's (GPT-2: 3 + 1 + 8 = 12). `kv_repeated`: the attention kernel is handed grouped K/V
    repeated to the query heads (TrainingSettings.kv_repeated)."""
    key_value = shape.key_value_heads / shape.num_attention_heads
    rotary = shape.use_rotary_position_embeddings
    repeated = kv_repeated and shape.key_value_heads < shape.num_attention_heads
    views_of_qkv = not rotary or not repeated  # q, k or v read straight from the fused projection's output
    attention = ((1 + 2 * key_value) * views_of_qkv + rotary  # the QKV output, the rotated q
                 + (2 if repeated else key_value * rotary)  # repeated k and v, or the rotated k
                 + 1)  # the attention output
    return attention + mlp_values(shape)


def mlp_values(shape: ModelShape) -> float:
    """The MLP's split values per s b h: GeLU's input and output (2f), or SwiGLU's gate|up, SiLU(gate) and their
    product (4f)."""
    return (4 if shape.swiglu else 2) * shape.ffn / shape.hidden_size


def stage_activation_bytes(shape: ModelShape, layout: Layout, settings: TrainingSettings) -> float:
    """One micro-batch through a stage's layers: all of them, or under recompute their inputs plus the largest
    layer; with experts, plus the largest MoE layer's transient dispatch buffers."""
    layers = layers_per_stage(shape.num_layers, layout.pipeline)
    if shape.has_experts:  # one stage: every layer, each by its own MLP
        full = [layer_activation_bytes(shape, layout, settings, number) for number in range(1, layers + 1)]
    else:
        full = [layer_activation_bytes(shape, layout, settings)] * layers
    transient = max((moe.transient_bytes(shape, layout, settings, experts) for experts in shape.moe_layer_experts()),
                    default=0.0)
    if not layout.recompute:
        return sum(full) + transient
    recomputed = layers if layout.recompute_layers is None else min(layout.recompute_layers, layers)
    layer_input = local_tokens(shape, layout) * shape.hidden_size * settings.dtype_bytes
    kept_inputs = recomputed * layer_input / (layout.tensor if layout.sequence_parallel else 1)
    # Backward frees the kept layers (the last ones) before it rebuilds the recomputed ones, one at a time.
    return kept_inputs + max(sum(full[recomputed:]), max(full[:recomputed], default=0.0)) + transient


def logits_bytes(shape: ModelShape, layout: Layout, settings: TrainingSettings) -> float:
    return local_tokens(shape, layout) * shape.padded_vocab(layout.tensor) / layout.tensor * settings.dtype_bytes


def logits_and_loss_bytes(shape: ModelShape, layout: Layout, settings: TrainingSettings) -> float:
    logits = logits_bytes(shape, layout, settings)
    return logits + min(settings.loss_chunk_bytes, 4 * logits / settings.dtype_bytes)


def in_flight_micro_batches(layout: Layout, stage: int, micro_batches: int) -> int:
    return max(1, min(layout.pipeline - stage, micro_batches))


def estimate_memory(shape: ModelShape, layout: Layout, settings: TrainingSettings,
                    fragmentation: float = FRAGMENTATION) -> MemoryEstimate:
    """The memory of the heaviest pipeline stage (first or last: the middle ones hold fewer in flight than the
    first and no embedding)."""
    micro_batches = settings.global_batch_size // (layout.micro_batch * layout.data)
    estimates = []
    for stage in sorted({0, layout.pipeline - 1}):
        parameters = stage_parameters(shape, layout.tensor, layout.pipeline, stage, settings.pipeline_engine,
                                      layout.expert_parallel)
        experts = stage_expert_parameters(shape, layout.expert_parallel, layout.tensor)
        terms = model_state_bytes(parameters, layout, settings, experts)
        terms["accumulated_gradients"] = terms["gradients"] if micro_batches > 1 else 0.0
        one = stage_activation_bytes(shape, layout, settings)
        terms["activations"] = one
        terms["pipeline_in_flight"] = (in_flight_micro_batches(layout, stage, micro_batches) - 1) * one
        last = stage == layout.pipeline - 1
        terms["logits_and_loss"] = logits_and_loss_bytes(shape, layout, settings) if last else 0
        terms["kept_logits"] = logits_bytes(shape, layout, settings) if last and settings.pipeline_engine else 0
        phase = max(PHASES, key=lambda name: sum(terms[term] for term in PHASES[name]))
        terms["fragmentation"] = fragmentation * sum(terms[term] for term in PHASES[phase])
        estimates.append(MemoryEstimate(**terms, peak_phase=phase, stage=stage))
    return max(estimates, key=lambda estimate: estimate.total)
