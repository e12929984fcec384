"""Megatron's unfused attention: scores, mask and softmax as separate operations, with its two fp16 safeguards.

Query-key layer scaling divides the scores of layer L by L (on top of 1/sqrt(head_dim)) while they are in half
precision, and multiplies them by L again in fp32 right before the softmax, so large scores cannot overflow
fp16; the probabilities are mathematically unchanged. --attention-softmax-in-fp32 (implied by the scaling)
runs mask and softmax in fp32. Masked positions get -10000, as in Megatron. The fused kernel (PyTorch's
scaled_dot_product_attention, or a device's registered kernel) already does all of this in fp32 inside.
"""
import math
from typing import Optional

import torch
import torch.nn.functional as F

MASKED_SCORE = -10000.0


class UnfusedAttention:
    """An attention kernel (see model/kernels.py for the contract) for one layer."""

    def __init__(self, layer_number: int, apply_query_key_layer_scaling: bool, softmax_in_fp32: bool):
        self.coefficient = float(layer_number) if apply_query_key_layer_scaling else None
        self.softmax_in_fp32 = softmax_in_fp32 or apply_query_key_layer_scaling

    def __call__(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: Optional[torch.Tensor], dropout_p: float) -> torch.Tensor:
        norm_factor = math.sqrt(query.shape[-1]) * (self.coefficient or 1.0)
        # Scaling the query first keeps the half-precision product in range (Megatron scales inside its matmul).
        scores = torch.matmul(query / norm_factor, key.transpose(-1, -2))
        if self.softmax_in_fp32:
            scores = scores.float()
        if self.coefficient is not None:
            scores = scores * self.coefficient
        if attention_mask is None:  # causal; the queries are the last of the keys' positions
            queries, keys = scores.shape[-2:]
            attention_mask = torch.ones(queries, keys, dtype=torch.bool, device=scores.device).triu(keys - queries + 1)
        probabilities = torch.softmax(scores.masked_fill(attention_mask, MASKED_SCORE), dim=-1).to(value.dtype)
        return torch.matmul(F.dropout(probabilities, p=dropout_p), value)
