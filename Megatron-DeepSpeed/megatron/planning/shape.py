"""What the layout planner knows about a job: the model's shape and the training settings that size memory,
and how many parameters each rank of a layout holds (the same pieces model/gpt.py and model/pipe.py build).

Kept apart from the model code on purpose: the planner answers for a 175B model on a laptop, so it counts
instead of building.
"""
import math
from dataclasses import dataclass

from megatron.config.presets import get_preset
from megatron.errors import InputError
from megatron.tokenizer import vocab_size_with_padding

GPT2_VOCAB_SIZE = 50257
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
DEEPSPEED_REDUCE_BUCKET = 500_000_000  # zero_optimization.reduce_bucket_size's default, elements


@dataclass(frozen=True)
class ModelShape:
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    seq_length: int
    max_position_embeddings: int
    vocab_size: int  # the tokenizer's, before padding
    make_vocab_size_divisible_by: int = 128
    ffn_hidden_size: int = 0  # 0: 4 x hidden

    @property
    def ffn(self) -> int:
        return self.ffn_hidden_size or 4 * self.hidden_size

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
    recompute: bool
    sequence_parallel: bool

    @property
    def devices(self) -> int:
        return self.tensor * self.pipeline * self.data


@dataclass(frozen=True)
class TrainingSettings:
    """What the planner does not choose: the batch, the precision and the kernels."""
    global_batch_size: int
    dtype: str = "bf16"  # fp32, bf16 or fp16
    hidden_dropout: float = 0.0
    fused_attention: bool = True  # scaled-dot-product attention (no score matrix kept), else Megatron's unfused
    pipeline_engine: bool = True  # DeepSpeed's pipeline engine even at PP 1 (the trainer's default)
    zero_reduce_bucket_size: int = DEEPSPEED_REDUCE_BUCKET

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]


def shape_from_preset(name: str, vocab_size: int = GPT2_VOCAB_SIZE) -> tuple[ModelShape, TrainingSettings]:
    preset = get_preset(name)
    if max(preset.get("num_experts", [1])) > 1:
        raise InputError(f"--model-size {name}: the layout planner does not model mixture-of-experts layers yet; "
                         f"give a dense preset or the model flags")
    shape = ModelShape(num_layers=preset["num_layers"], hidden_size=preset["hidden_size"],
                       num_attention_heads=preset["num_attention_heads"], seq_length=preset["seq_length"],
                       max_position_embeddings=preset["seq_length"], vocab_size=vocab_size)
    return shape, TrainingSettings(global_batch_size=preset["global_batch_size"],
                                   pipeline_engine=not preset["no_pipeline_parallel"])


def layer_parameters(shape: ModelShape, tensor: int) -> int:
    """One transformer layer on one tensor-parallel rank: two LayerNorms and the row-parallel biases whole,
    the column-parallel weights and biases and the row-parallel weights split."""
    h, f = shape.hidden_size, shape.ffn
    whole = 2 * 2 * h + h + h  # LayerNorm weight and bias x 2, attention.dense bias, dense_4h_to_h bias
    split = 3 * h * h + 3 * h + h * h + f * h + f + f * h
    return whole + split // tensor


def embedding_parameters(shape: ModelShape, tensor: int) -> int:
    """The embedding piece: this rank's vocabulary rows and every position."""
    return shape.padded_vocab(tensor) * shape.hidden_size // tensor + shape.max_position_embeddings * shape.hidden_size


def layers_per_stage(num_layers: int, pipeline: int) -> int:
    """The most transformer layers one stage holds (stages differ by at most one)."""
    return math.ceil(num_layers / pipeline)


def stage_parameters(shape: ModelShape, tensor: int, pipeline: int, stage: int, pipeline_engine: bool = True) -> int:
    """Parameters one rank of pipeline stage `stage` holds. The first stage has the embedding, the last the final
    LayerNorm and, on the pipeline engine with more than one stage, its own copy of the embedding piece (tied
    word embeddings; its position embeddings come along unused)."""
    if not 0 <= stage < pipeline:
        raise InputError(f"stage {stage} is outside pipeline size {pipeline}")
    if pipeline > 1 and not pipeline_engine:
        raise InputError("--no-pipeline-parallel runs one stage; use --pipeline-model-parallel-size 1")
    count = layers_per_stage(shape.num_layers, pipeline) * layer_parameters(shape, tensor)
    if stage == 0:
        count += embedding_parameters(shape, tensor)
    if stage == pipeline - 1:
        count += 2 * shape.hidden_size + (embedding_parameters(shape, tensor) if pipeline > 1 else 0)
    return count


def from_flags(flags, vocab_size: int):
    """(ModelShape, Layout, TrainingSettings), estimate_memory's arguments, of a validated dense pretrain_gpt.py command line (config/arguments.py),
    for the tokenizer's `vocab_size`."""
    shape = ModelShape(num_layers=flags.num_layers, hidden_size=flags.hidden_size,
                       num_attention_heads=flags.num_attention_heads, seq_length=flags.seq_length,
                       max_position_embeddings=flags.max_position_embeddings, vocab_size=vocab_size,
                       make_vocab_size_divisible_by=flags.make_vocab_size_divisible_by,
                       ffn_hidden_size=flags.ffn_hidden_size)
    dtype = "bf16" if flags.bf16 else "fp16" if flags.fp16 else "fp32"
    settings = TrainingSettings(global_batch_size=flags.global_batch_size, dtype=dtype,
                                hidden_dropout=flags.hidden_dropout, fused_attention=flags.masked_softmax_fusion,
                                pipeline_engine=not flags.no_pipeline_parallel,
                                zero_reduce_bucket_size=flags.zero_reduce_bucket_size or DEEPSPEED_REDUCE_BUCKET)
    layout = Layout(flags.tensor_model_parallel_size, flags.pipeline_model_parallel_size, flags.data_parallel_size,
                    flags.zero_stage, flags.micro_batch_size, flags.checkpoint_activations, flags.sequence_parallel)
    return shape, layout, settings
