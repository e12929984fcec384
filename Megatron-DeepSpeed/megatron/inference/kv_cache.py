"""Keys and values of the positions already seen, so each decoding step feeds only the new token.

Buffers are allocated once for the whole generation (prompt + new tokens) and filled in place: a step costs
one write per layer instead of re-concatenating the past, so the per-token cost grows only with the attention
over the cached positions. A layer's buffers take their shape from the first keys it stores, hence hold
exactly this rank's attention heads under tensor parallelism.
"""
from typing import List, Optional

import torch


class LayerKVCache:
    """One transformer layer's cache; SelfAttention calls `extend` with the new positions' keys and values."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.length = 0
        self.keys: Optional[torch.Tensor] = None  # [batch, local heads, capacity, head_dim]
        self.values: Optional[torch.Tensor] = None

    def extend(self, key: torch.Tensor, value: torch.Tensor):
        """Store key/value [batch, heads, new, head_dim] after the cached positions; return the keys and values
        of every position so far."""
        batch, heads, new, head_dim = key.shape
        if self.keys is None:
            self.keys = key.new_empty((batch, heads, self.capacity, head_dim))
            self.values = value.new_empty((batch, heads, self.capacity, head_dim))
        end = self.length + new
        if end > self.capacity:
            raise ValueError(f"KV cache holds {self.capacity} positions; {self.length} cached + {new} new do not fit")
        self.keys[:, :, self.length:end] = key
        self.values[:, :, self.length:end] = value
        self.length = end
        return self.keys[:, :, :end], self.values[:, :, :end]


class KVCache:
    """A LayerKVCache per transformer layer; `length` is the number of positions cached so far."""

    def __init__(self, num_layers: int, capacity: int):
        self.layers: List[LayerKVCache] = [LayerKVCache(capacity) for _ in range(num_layers)]

    @property
    def length(self) -> int:
        return self.layers[0].length
