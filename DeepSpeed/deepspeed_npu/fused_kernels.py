"""torch_npu's fused kernels, shaped to the contracts of the trainer's megatron/model/kernels.py.

The model calls attention as (query, key, value, attention_mask, dropout_p) on [batch, heads, seq, dim]
tensors with Megatron's mask (True = may not attend, None = causal). torch_npu.npu_fusion_attention uses
the same True-is-masked convention, so an explicit mask passes through unchanged; plain causal attention
uses the kernel's own causal mode, which reads a fixed 2048 x 2048 compressed mask instead of a
[seq, seq] one, so long sequences cost no mask memory.
"""
import math
import re
from dataclasses import dataclass
from types import ModuleType
from typing import Callable, Dict, Optional

import torch

# npu_fusion_attention's sparse_mode values (torch_npu documentation).
MASK_AS_GIVEN = 0
TOP_LEFT_CAUSAL = 2
COMPRESSED_CAUSAL_MASK_SIZE = 2048
# First-generation Ascend 910 chips (Atlas training series) have no fused attention kernel;
# Atlas A2 chips report names such as "Ascend910B3" and A3 chips "Ascend910_93..", which do not match.
FIRST_GENERATION_CHIP = re.compile(r"Ascend910(Pro|Premium)?[AB]?")


class FusionAttention:
    """Megatron's attention contract on top of torch_npu.npu_fusion_attention."""

    def __init__(self, fusion_attention: Callable):
        self._fusion_attention = fusion_attention
        self._causal_masks: Dict[torch.device, torch.Tensor] = {}  # built once per device, reused every call

    def __call__(self, query, key, value, attention_mask, dropout_p):
        if attention_mask is None:
            mask, sparse_mode = self._causal_mask(query.device), TOP_LEFT_CAUSAL
        else:
            mask, sparse_mode = attention_mask, MASK_AS_GIVEN
        outputs = self._fusion_attention(
            query, key, value, query.shape[1], "BNSD", atten_mask=mask, scale=1.0 / math.sqrt(query.shape[-1]),
            keep_prob=1.0 - dropout_p, sparse_mode=sparse_mode)
        return outputs[0]  # the rest are softmax statistics and RNG state kept for the backward pass

    def _causal_mask(self, device: torch.device) -> torch.Tensor:
        if device not in self._causal_masks:
            size = COMPRESSED_CAUSAL_MASK_SIZE
            self._causal_masks[device] = torch.ones(size, size, dtype=torch.bool, device=device).triu(diagonal=1)
        return self._causal_masks[device]


@dataclass(frozen=True)
class NpuKernels:
    attention: Optional[Callable]  # None: keep the portable PyTorch kernel
    adam: Optional[Callable]

    def description(self) -> str:
        attention = "torch_npu fused attention" if self.attention else "PyTorch SDPA attention"
        adam = "NpuFusedAdamW" if self.adam else "torch AdamW"
        return f"{attention}, {adam}"


def npu_kernels(torch_npu: ModuleType, chip_name: str) -> NpuKernels:
    """The fused kernels this torch_npu build and chip provide; a missing one keeps the portable kernel."""
    fusion_attention = getattr(torch_npu, "npu_fusion_attention", None)
    if FIRST_GENERATION_CHIP.fullmatch(chip_name):
        fusion_attention = None
    fused_adamw = getattr(getattr(torch_npu, "optim", None), "NpuFusedAdamW", None)
    return NpuKernels(attention=FusionAttention(fusion_attention) if fusion_attention else None, adam=fused_adamw)
