"""What the layout planner knows about a job: the model's shape and the training settings that size memory,
and how many parameters each rank of a layout holds (the same pieces model/gpt.py and model/pipe.py build).

Kept apart from the model code on purpose: the planner answers for a 175B model on a laptop, so it counts
instead of building. A mixture-of-experts model (model/moe.py) counts as DeepSpeed's MoE layer builds it: in each
MoE layer a gate (hidden x experts, no bias) and experts / EP MLPs per rank (whole, or with
--enable-expert-tensor-parallelism split as the dense MLP is), plus, for PR-MoE (--mlp-type residual), a dense
MLP (split with the experts, else whole) and its 2-way mixing coefficient. The architecture variants of
model/gpt.py (RMSNorm's weight-only norms, no linear biases, grouped-query K/V, SwiGLU's two input branches, no
position table, an untied output layer on the last stage) are ModelConfig's fields, which ModelShape extends.
"""
import math
from dataclasses import dataclass, fields
from typing import Optional

from megatron.config.flags.moe import recorded_moe_config
from megatron.config.job import MoEConfig
from megatron.config.model_config import VARIANT_FLAGS, ModelConfig
from megatron.config.presets import get_preset
from megatron.errors import InputError
from megatron.tokenizer import vocab_size_with_padding

GPT2_VOCAB_SIZE = 50257
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
DEEPSPEED_REDUCE_BUCKET = 500_000_000  # zero_optimization.reduce_bucket_size's default, elements (a test holds it)
# model/cross_entropy.py's CHUNK_BYTES, an accelerator's loss chunk (a test holds them equal; the planner does not
# import torch)
ACCELERATOR_LOSS_CHUNK_BYTES = 1 << 28


@dataclass(frozen=True, kw_only=True)
class ModelShape(ModelConfig):
    """The model's flags (ModelConfig's fields, declared there once) and what else sizes it: the sequence, the
    tokenizer's vocabulary and its padding, and the experts."""
    seq_length: int
    vocab_size: int  # the tokenizer's, before padding
    make_vocab_size_divisible_by: int = 128
    moe: Optional[MoEConfig] = None  # None or every count 1: dense

    def __post_init__(self):
        """Unlike ModelConfig, the derived sizes stay None (ffn and key_value_heads give them), so a shape copied
        with another hidden size or head count derives them afresh."""

    @property
    def ffn(self) -> int:
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def key_value_heads(self) -> int:
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def norm_parameters(self) -> int:
        """One norm: LayerNorm's weight and bias, RMSNorm's weight."""
        return self.hidden_size * (2 if self.normalization == "layernorm" else 1)

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def has_experts(self) -> bool:
        return self.moe is not None and self.moe.enabled

    def experts_of_layer(self, layer_number: int) -> int:
        """Experts of 1-based layer `layer_number`; 1 for a dense MLP."""
        return self.moe.experts_of_layer(layer_number) if self.has_experts else 1

    def moe_layer_experts(self) -> list:
        """The expert count of each MoE layer, in layer order."""
        return [count for count in map(self.experts_of_layer, range(1, self.num_layers + 1)) if count > 1]

    def padded_vocab(self, tensor: int) -> int:
        return vocab_size_with_padding(self.vocab_size, self.make_vocab_size_divisible_by, tensor)


@dataclass(frozen=True)
class Layout:
    """What the planner chooses."""
    tensor: int
    pipeline: int
    data: int
    zero_stage: int
    micro_batch: int
    recompute: bool  # whole layers recomputed: every layer, or with recompute_layers only that many per stage
    sequence_parallel: bool
    expert_parallel: int = 1  # ranks a layer's experts are spread over; divides data
    recompute_layers: Optional[int] = None  # upstream main's --recompute-method block: layers recomputed per stage
    selective_recompute: bool = False  # --recompute-granularity selective: each layer's attention core recomputed
    ulysses: int = 1  # DeepSpeed-Ulysses ranks sharing each sequence (--ds-sequence-parallel-size)

    @property
    def devices(self) -> int:
        return self.tensor * self.pipeline * self.data * self.ulysses

    @property
    def zero_partitions(self) -> int:
        """The ranks ZeRO partitions over (and gradients are reduced over): data x Ulysses."""
        return self.data * self.ulysses


@dataclass(frozen=True)
class TrainingSettings:
    """What the planner does not choose: the batch, the precision and the kernels."""
    global_batch_size: int
    dtype: str = "bf16"  # fp32, bf16 or fp16
    hidden_dropout: float = 0.0
    fused_attention: bool = True  # scaled-dot-product attention (no score matrix kept), else Megatron's unfused
    pipeline_engine: bool = True  # DeepSpeed's pipeline engine even at PP 1 (the trainer's default)
    zero_reduce_bucket_size: Optional[int] = None  # elements; None: the trainer's, the rank's parameters up to 5e8
    loss_chunk_bytes: int = ACCELERATOR_LOSS_CHUNK_BYTES  # the device's (model/kernels.py): a CPU's is smaller
    kv_repeated: bool = True  # grouped K/V repeated to the query heads (model/kernels.py's repeats_grouped_kv of the
    # run's attention kernel); False where the kernel takes them grouped (Ascend A2's fusion attention)

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]


def shape_from_preset(name: str, vocab_size: int = GPT2_VOCAB_SIZE) -> tuple[ModelShape, TrainingSettings]:
    """A preset's shape (its MoE section included, with upstream's defaults for the MoE flags it does not set)."""
    preset = get_preset(name)
    moe = recorded_moe_config(preset)
    shape = ModelShape(num_layers=preset["num_layers"], hidden_size=preset["hidden_size"],
                       num_attention_heads=preset["num_attention_heads"], seq_length=preset["seq_length"],
                       max_position_embeddings=preset["seq_length"], vocab_size=vocab_size,
                       ffn_hidden_size=preset.get("ffn_hidden_size"), moe=moe if moe.enabled else None,
                       **architecture_variants(preset))
    return shape, TrainingSettings(global_batch_size=preset["global_batch_size"],
                                   pipeline_engine=not preset["no_pipeline_parallel"])


def architecture_variants(values) -> dict:
    """ModelShape's variant fields from flags or a preset (argparse names; a missing one keeps GPT-2's)."""
    counted = {spec.name for spec in fields(ModelShape)}
    return {name: values[name] for name in VARIANT_FLAGS if name in counted and values.get(name) is not None}


def mlp_parameters(shape: ModelShape, tensor: int) -> int:
    """One MLP on one tensor-parallel rank: dense_h_to_4h (both branches of SwiGLU) split, dense_4h_to_h's weight
    split and its bias whole."""
    h, f, bias = shape.hidden_size, shape.ffn, shape.add_bias_linear
    inner = (2 if shape.swiglu else 1) * f
    return bias * h + (inner * h + bias * inner + f * h) // tensor


def expert_split(shape: ModelShape, tensor: int) -> int:
    """Over how many ranks the experts (and PR-MoE's dense MLP beside them) are split: the `tensor` ranks with
    --enable-expert-tensor-parallelism, else none."""
    return tensor if shape.moe is not None and shape.moe.expert_tensor_parallel else 1


def expert_parameters(shape: ModelShape, expert_parallel: int, layer_number: int, tensor: int = 1) -> int:
    """The parameters of the experts one rank holds in 1-based layer `layer_number` (0 in a dense layer):
    experts / EP MLPs, whole unless the experts are split over the `tensor` ranks too. Only these are sharded by
    expert parallelism."""
    experts = shape.experts_of_layer(layer_number)
    return 0 if experts == 1 else experts // expert_parallel * mlp_parameters(shape, expert_split(shape, tensor))


def layer_parameters(shape: ModelShape, tensor: int, layer_number: int = 1, expert_parallel: int = 1) -> int:
    """One transformer layer on one rank: two norms and the row-parallel attention bias whole, the QKV (queries
    and the grouped keys and values) and attention-output weights split; then its MLP, or in an MoE layer the
    gate, this rank's experts and PR-MoE's dense MLP and coefficient; --qk-layernorm's two head-sized norms whole."""
    h, bias = shape.hidden_size, shape.add_bias_linear
    queries = shape.num_attention_heads * shape.head_dim
    qkv = queries + 2 * shape.key_value_heads * shape.head_dim
    qk_norms = shape.qk_layernorm * 2 * shape.norm_parameters // h * shape.head_dim
    attention = (2 * shape.norm_parameters + qk_norms + bias * h
                 + (qkv * h + (bias or shape.add_qkv_bias) * qkv + queries * h) // tensor)
    experts = shape.experts_of_layer(layer_number)
    if experts == 1:
        return attention + mlp_parameters(shape, tensor)
    residual = mlp_parameters(shape, expert_split(shape, tensor)) + 2 * h + 2 if shape.moe.mlp_type == "residual" else 0
    return attention + h * experts + expert_parameters(shape, expert_parallel, layer_number, tensor) + residual


def embedding_parameters(shape: ModelShape, tensor: int) -> int:
    """The embedding piece: this rank's vocabulary rows and every position (if it has a position table)."""
    positions = shape.max_position_embeddings if shape.add_position_embedding else 0
    return vocabulary_rows(shape, tensor) + positions * shape.hidden_size


def vocabulary_rows(shape: ModelShape, tensor: int) -> int:
    """This rank's rows of a [vocabulary, hidden] matrix (the word embedding, an untied output layer)."""
    return shape.padded_vocab(tensor) * shape.hidden_size // tensor


def head_parameters(shape: ModelShape, tensor: int, pipeline: int) -> int:
    """The last stage's after the layers: the final norm; an untied output layer, or, on the pipeline engine
    with several stages, the tied embedding piece's copy (its position embeddings come along unused)."""
    if shape.untie_embeddings_and_output_weights:
        return shape.norm_parameters + vocabulary_rows(shape, tensor)
    return shape.norm_parameters + (embedding_parameters(shape, tensor) if pipeline > 1 else 0)


def layers_per_stage(num_layers: int, pipeline: int) -> int:
    """The most transformer layers one stage holds (stages differ by at most one)."""
    return math.ceil(num_layers / pipeline)


def stage_parameters(shape: ModelShape, tensor: int, pipeline: int, stage: int, pipeline_engine: bool = True,
                     expert_parallel: int = 1) -> int:
    """Parameters one rank of pipeline stage `stage` holds. The first stage has the embedding, the last the head
    (head_parameters). An MoE model has one stage."""
    if not 0 <= stage < pipeline:
        raise InputError(f"stage {stage} is outside pipeline size {pipeline}")
    if pipeline > 1 and not pipeline_engine:
        raise InputError("--no-pipeline-parallel runs one stage; use --pipeline-model-parallel-size 1")
    if pipeline > 1 and shape.has_experts:
        raise InputError("--num-experts above 1 runs on the plain engine, one stage; use "
                         "--pipeline-model-parallel-size 1")
    if shape.has_experts:
        count = sum(layer_parameters(shape, tensor, number, expert_parallel)
                    for number in range(1, shape.num_layers + 1))
    else:
        count = layers_per_stage(shape.num_layers, pipeline) * layer_parameters(shape, tensor)
    if stage == 0:
        count += embedding_parameters(shape, tensor)
    if stage == pipeline - 1:
        count += head_parameters(shape, tensor, pipeline)
    return count


def stage_expert_parameters(shape: ModelShape, expert_parallel: int, tensor: int = 1) -> int:
    """The parameters of all experts one rank holds (an MoE model has one stage)."""
    return sum(expert_parameters(shape, expert_parallel, number, tensor) for number in range(1, shape.num_layers + 1))


def from_flags(flags, vocab_size: int):
    """(ModelShape, Layout, TrainingSettings), estimate_memory's arguments, of a validated pretrain_gpt.py command
    line (config/arguments.py), for the tokenizer's `vocab_size`."""
    moe = recorded_moe_config(vars(flags))
    shape = ModelShape(num_layers=flags.num_layers, hidden_size=flags.hidden_size,
                       num_attention_heads=flags.num_attention_heads, seq_length=flags.seq_length,
                       max_position_embeddings=flags.max_position_embeddings, vocab_size=vocab_size,
                       make_vocab_size_divisible_by=flags.make_vocab_size_divisible_by,
                       ffn_hidden_size=flags.ffn_hidden_size, moe=moe if moe.enabled else None,
                       **architecture_variants(vars(flags)))
    dtype = "bf16" if flags.bf16 else "fp16" if flags.fp16 else "fp32"
    settings = TrainingSettings(global_batch_size=flags.global_batch_size, dtype=dtype,
                                hidden_dropout=flags.hidden_dropout, fused_attention=flags.masked_softmax_fusion,
                                pipeline_engine=not flags.no_pipeline_parallel,
                                zero_reduce_bucket_size=flags.zero_reduce_bucket_size or None)
    full = flags.recompute_granularity == "full"
    layout = Layout(flags.tensor_model_parallel_size, flags.pipeline_model_parallel_size, flags.data_parallel_size,
                    flags.zero_stage, flags.micro_batch_size, flags.checkpoint_activations or full,
                    flags.sequence_parallel, flags.moe_expert_parallel_size if shape.has_experts else 1,
                    recompute_layers=flags.recompute_num_layers if full and flags.recompute_method == "block" else None,
                    selective_recompute=flags.recompute_granularity == "selective",
                    ulysses=flags.ds_sequence_parallel_size)
    return shape, layout, settings
