"""Rotary position embeddings (Su et al., RoFormer), as upstream Megatron-DeepSpeed main applies them.

The first `dim` channels of each query and key head rotate by an angle proportional to the token's position
(`--rotary-percent` of the head; the rest pass through). Channel i of the first half pairs with channel i of the
second half (the "rotate half" form of GPT-NeoX, Megatron and Hugging Face Llama, not the interleaved pairs of
the original paper), with frequency theta^(-2i / dim). Each token turns by its own position id, so documents packed
into one sequence with restarting positions (--reset-position-ids) each start at 0, as trained alone (upstream
turned every row by 0, 1, ... whatever its position ids said).
The angles are worked out in fp32 on the fly: the model holds no table that a cast to half precision would round.
A rotary scaling rule (families/rope_scaling.py: llama3, linear, yarn) changes the frequencies and, for YaRN, scales
the cos / sin tables.
"""
from dataclasses import dataclass
from typing import Callable

import torch

from megatron.errors import InputError
from megatron.model.kernels import rotate_half_mul
from megatron.families.rope_scaling import RopeScaling


@dataclass(frozen=True)
class RotaryEmbedding:
    dim: int  # rotating channels per head, even
    theta: float
    multiply: Callable = rotate_half_mul  # the kernels' rotary_mul (model/kernels.py)
    scaling: RopeScaling = RopeScaling()

    @classmethod
    def for_heads(cls, head_dim: int, percent: float, theta: float, multiply: Callable = rotate_half_mul,
                  scaling: RopeScaling = RopeScaling()) -> "RotaryEmbedding":
        dim = int(head_dim * percent)
        if dim == 0 or dim % 2:
            raise InputError(f"--rotary-percent {percent} of the head size {head_dim} is {dim} channels; rotary "
                             "embeddings rotate channel pairs, so choose a percent that gives an even, non-zero "
                             "count")
        return cls(dim, float(theta), multiply, scaling)

    def angles(self, positions: torch.Tensor) -> torch.Tensor:
        """[rows, seq, dim] angles of `positions` [rows, seq], each frequency twice (both halves)."""
        angles = positions.to(torch.float32).unsqueeze(-1) * self.frequencies(positions.device)
        return torch.cat((angles, angles), dim=-1)

    def frequencies(self, device) -> torch.Tensor:
        """[dim / 2] fp32 frequencies, theta^(-2i / dim) under the scaling rule."""
        base = self.theta ** (-torch.arange(0, self.dim, 2, device=device, dtype=torch.float32) / self.dim)
        return self.scaling.frequencies(base, self.theta)

    def __call__(self, heads: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """`heads` [batch, heads, seq, head_dim] rotated by `positions` [batch or 1, seq]."""
        angles = self.angles(positions)
        scale = self.scaling.cos_sin_scale
        cos, sin = ((part * scale).to(heads.dtype)[:, None]  # [b or 1, 1, s, dim]
                    for part in (angles.cos(), angles.sin()))
        if self.dim == heads.shape[-1]:
            return self.multiply(heads, cos, sin)
        rotating, passing = heads[..., :self.dim].contiguous(), heads[..., self.dim:]
        return torch.cat((self.multiply(rotating, cos, sin), passing), dim=-1)
