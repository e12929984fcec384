"""What one attention call computes, as data. Every attention implementation (model/kernels.py's contract) takes an
AttentionSpec, so a new masking rule is a field here and a case in the kernels, never a change to their callers.

Queries are the LAST positions of the keys (with a KV cache there are fewer queries than keys; otherwise as many).
A query at position i sees the key at position j when all of these hold:
- causal: j <= i;
- window_size w (None: no window): j >= i - w, so a query sees at most w + 1 keys, itself included. This is the left
  part of Megatron-LM's --window-size (left, right) with right 0, flash-attn's and Transformer Engine's window_size[0].
  Hugging Face's Mistral `sliding_window` W lets query i see keys i - W < j <= i (transformers' masking_utils
  sliding_window_overlay: kv_idx > q_idx - W), so W maps to window_size = W - 1;
- segment_ids (packed sequences; None: one stream): int64 [batch, key positions], non-decreasing along each row,
  the document each position belongs to; j's segment must equal i's. No [batch, 1, seq, seq] mask exists outside
  the kernel that needs one.
"""
from dataclasses import dataclass, replace
from typing import Optional

import torch

from megatron.errors import InputError


@dataclass(frozen=True)
class AttentionSpec:
    causal: bool = True
    window_size: Optional[int] = None
    dropout_p: float = 0.0
    softmax_scale: Optional[float] = None  # None: 1 / sqrt(head_dim)
    segment_ids: Optional[torch.Tensor] = None

    def __post_init__(self):
        if self.window_size is not None and (self.window_size < 0 or not self.causal):
            raise InputError(f"window_size {self.window_size}: a sliding window is a causal model's count of earlier "
                             "keys each query sees, 0 or more (None: no window)")

    def for_batch(self, segment_ids: Optional[torch.Tensor], training: bool) -> "AttentionSpec":
        """This spec for one forward: the batch's documents, and no dropout outside training."""
        return replace(self, segment_ids=segment_ids, dropout_p=self.dropout_p if training else 0.0)

    def scale(self, head_dim: int) -> float:
        return self.softmax_scale if self.softmax_scale is not None else head_dim ** -0.5

    @property
    def plain_causal(self) -> bool:
        """Causal over one stream, no window: what every fused kernel has a mask-free mode for."""
        return self.causal and self.window_size is None and self.segment_ids is None

    def sees(self, batch, query, key) -> torch.Tensor:
        """Whether the query at position `query` sees the key at `key` in row `batch` (index tensors that broadcast
        together): the rule above, as FlexAttention's mask_mod and the dense reference both evaluate it."""
        allowed = key <= query if self.causal else torch.ones_like(key == query)
        if self.window_size is not None:
            allowed = allowed & (key >= query - self.window_size)
        if self.segment_ids is not None:
            allowed = allowed & (self.segment_ids[batch, query] == self.segment_ids[batch, key])
        return allowed

    def allowed(self, query_length: int, key_length: int, device) -> torch.Tensor:
        """bool [batch or 1, 1, query_length, key_length], True = may attend: the dense mask for the kernels that
        take one, built inside the kernel per call (never by the data pipeline)."""
        keys = torch.arange(key_length, device=device)
        queries = keys[key_length - query_length:]
        rows = torch.arange(1 if self.segment_ids is None else self.segment_ids.shape[0], device=device)
        return self.sees(rows[:, None, None], queries[None, :, None], keys[None, None, :]).unsqueeze(1)

    def document_ends(self) -> list:
        """Where each document ends, counted over the batch's rows laid end to end (varlen kernels' cumulative
        lengths, e.g. [3, 8, 16] for rows of 8 holding documents of 3, 5 and 8): a row's end is always one."""
        ends = torch.ones_like(self.segment_ids, dtype=torch.bool)
        ends[:, :-1] = self.segment_ids[:, 1:] != self.segment_ids[:, :-1]
        return (ends.flatten().nonzero().flatten() + 1).tolist()
