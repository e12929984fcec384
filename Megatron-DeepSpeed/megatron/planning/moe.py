"""What an MoE layer (DeepSpeed 0.19.8's deepspeed.moe, built by model/moe.py) adds to a layout's memory and step
time beyond its parameters: the capacity-sized buffers its tokens travel in and the all-to-all that moves them.

DeepSpeed's dispatch, read from its sharded_moe.py: the gate runs in fp32 on the layer's S = s x b tokens (every
tensor-parallel rank sees them all) and gives each expert a capacity C = ceil(S / E x capacity_factor x topk), at
least --moe-min-capacity; the tokens are gathered into an E x C x h buffer (slots past an expert's capacity are
dropped), which tensor parallelism splits along C, an all-to-all sends each expert its slots, the experts run,
a second all-to-all brings the results back, and each token sums its top-k results weighted by its gate values
in fp32. Without token dropping the capacity is the busiest expert's load; the planner takes the capacity factor's
figure (a balanced gate) for it.

Kept for backward, per MoE layer and micro-batch, in bytes (B the model dtype's size, t tensor-parallel):
    gate          the fp32 copy of the input (S h x 4), the softmax of the logits and two fp32 token x expert
                  tensors of the top-k choice (3 x S E x 4) and its boolean mask (S E)
    experts       the experts' input after the all-to-all and their two 4h-wide tensors: B x E C (h + 2 f) / t
    combine       the top-k results gathered back per token (B x k S h) and their fp32 gate values (4 k S)
    PR-MoE        the dense MLP's input and 4h-wide tensors (B x S (h + 2 f)), the coefficient's softmax
                  (4 x 2 S) and the two outputs it mixes (B x 2 S h)
Transient (one layer at a time, in forward and again in backward): the all-to-all's input and output buffers
(B x 2 E C h / t) and the fp32 weighted results before they are summed (4 k S h).
"""
import math

from megatron.config.job import MoEConfig
from megatron.planning.shape import Layout, ModelShape, TrainingSettings


def capacity(moe: MoEConfig, tokens: int, experts: int) -> int:
    """Slots per expert for `tokens` tokens, as DeepSpeed's gate sizes them in training."""
    return max(math.ceil(tokens / experts * moe.train_capacity_factor * moe.topk), moe.min_capacity)


def slots(shape: ModelShape, layout: Layout, experts: int) -> int:
    """E x C: the rows of one MoE layer's dispatch buffer for one micro-batch (before tensor parallelism splits
    them)."""
    return experts * capacity(shape.moe, shape.seq_length * layout.micro_batch, experts)


def mlp_activation_bytes(shape: ModelShape, layout: Layout, settings: TrainingSettings, experts: int) -> float:
    """What one MoE layer's MLP keeps for backward for one micro-batch (the module docstring's table)."""
    tokens, h, f = shape.seq_length * layout.micro_batch, shape.hidden_size, shape.ffn
    size, k = settings.dtype_bytes, shape.moe.topk
    gate = 4 * tokens * h + (3 * 4 + 1) * tokens * experts
    kept_by_experts = size * slots(shape, layout, experts) * (h + 2 * f) / layout.tensor
    combine = size * k * tokens * h + 4 * k * tokens
    residual = (size * tokens * (h + 2 * f) + 4 * 2 * tokens + size * 2 * tokens * h
                if shape.moe.mlp_type == "residual" else 0)
    return gate + kept_by_experts + combine + residual


def transient_bytes(shape: ModelShape, layout: Layout, settings: TrainingSettings, experts: int) -> float:
    """The buffers of one MoE layer's dispatch that live only while it runs: the all-to-all's input and output and
    the fp32 weighted results."""
    tokens, h = shape.seq_length * layout.micro_batch, shape.hidden_size
    return (settings.dtype_bytes * 2 * slots(shape, layout, experts) * h / layout.tensor
            + 4 * shape.moe.topk * tokens * h)


def all_to_all_bytes(shape: ModelShape, layout: Layout, settings: TrainingSettings, experts: int) -> float:
    """Bytes one rank sends in one all-to-all of one MoE layer and micro-batch: its dispatch buffer's share for
    the other (EP - 1) / EP expert-parallel ranks."""
    ep = layout.expert_parallel
    buffer = settings.dtype_bytes * slots(shape, layout, experts) * shape.hidden_size / layout.tensor
    return buffer * (ep - 1) / ep
