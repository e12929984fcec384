"""Megatron's unfused attention: scores, mask and softmax as separate operations, with its two fp16 safeguards.

Query-key layer scaling divides the scores of layer L by L (on top of 1/sqrt(head_dim)) while they are in half
precision, and multiplies them by L again in fp32 right before the softmax, so large scores cannot overflow
fp16; the probabilities are mathematically unchanged. --attention-softmax-in-fp32 (implied by the scaling)
runs mask and softmax in fp32. Masked positions (those the AttentionSpec hides) get -10000, as in Megatron. The
fused kernel (PyTorch's scaled_dot_product_attention, or a device's registered kernel) already does all of this in
fp32 inside.
"""
import torch
import torch.nn.functional as F

from megatron.model.attention_spec import AttentionSpec

MASKED_SCORE = -10000.0


class UnfusedAttention:
    """An attention kernel (see model/kernels.py for the contract) for one layer."""

    def __init__(self, layer_number: int, apply_query_key_layer_scaling: bool, softmax_in_fp32: bool):
        self.coefficient = float(layer_number) if apply_query_key_layer_scaling else None
        self.softmax_in_fp32 = softmax_in_fp32 or apply_query_key_layer_scaling

    def __call__(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 spec: AttentionSpec) -> torch.Tensor:
        norm_factor = (self.coefficient or 1.0) / spec.scale(query.shape[-1])
        # Scaling the query first keeps the half-precision product in range (Megatron scales inside its matmul).
        scores = torch.matmul(query / norm_factor, key.transpose(-1, -2))
        if self.softmax_in_fp32:
            scores = scores.float()
        if self.coefficient is not None:
            scores = scores * self.coefficient
        masked = ~spec.allowed(scores.shape[-2], scores.shape[-1], scores.device)
        probabilities = torch.softmax(scores.masked_fill(masked, MASKED_SCORE), dim=-1).to(value.dtype)
        return torch.matmul(F.dropout(probabilities, p=spec.dropout_p), value)
