"""Which attention, layer-norm and Adam implementation a run uses, chosen once when the model is built.

The model never looks kernels up: `select_kernels` picks them for the device (plus whatever an adaptor
package such as the Ascend `deepspeed_npu` offers) and the result is passed into the model's config and the
optimizer. Nothing is registered globally, so two models in one process can use different kernels.

Kernel contracts:
- attention(query, key, value, attention_mask, dropout_p) -> context. query/key/value/context are
  [batch, heads, seq, head_dim]; attention_mask is None for plain causal attention, or a bool tensor
  [batch, 1, seq, seq] where True means "may not attend" (Megatron's convention). When generating with a KV
  cache, key/value hold more positions than query and the mask is [batch, 1, query seq, key seq].
- layer_norm: a module class built as layer_norm(hidden_size, eps=epsilon).
- adam: called as adam(params, lr=..., betas=..., eps=..., weight_decay=...) like torch.optim.AdamW
  (decoupled weight decay, as Megatron's Adam), returning a torch.optim.Optimizer.
"""
import functools
from dataclasses import dataclass, replace
from typing import Callable, Optional

import torch
import torch.nn.functional as F


def sdpa_attention(query, key, value, attention_mask, dropout_p):
    """PyTorch's scaled_dot_product_attention, which picks a flash / memory-efficient path by itself; the
    causal path passes no mask, so the flash kernel is eligible."""
    if attention_mask is None:
        return F.scaled_dot_product_attention(query, key, value, dropout_p=dropout_p, is_causal=True)
    # SDPA's boolean mask marks the positions that MAY be attended: the opposite of Megatron's.
    return F.scaled_dot_product_attention(query, key, value, attn_mask=~attention_mask, dropout_p=dropout_p)


@dataclass(frozen=True)
class Kernels:
    attention: Callable
    layer_norm: type
    adam: Callable


PORTABLE_KERNELS = Kernels(attention=sdpa_attention, layer_norm=torch.nn.LayerNorm, adam=torch.optim.AdamW)

# torch's fused AdamW exists for CPU and CUDA; on CPU it is ~9x faster than the default implementation.
DEVICES_WITH_FUSED_ADAMW = frozenset({"cpu", "cuda"})


def select_kernels(device_name: str, adaptor_kernels: Optional[object] = None) -> Kernels:
    """The kernels for `device_name`: PyTorch's (fused AdamW where torch has it), with every kernel that
    `adaptor_kernels` (an object with optional attention / layer_norm / adam attributes, None = keep ours)
    provides taking precedence."""
    kernels = PORTABLE_KERNELS
    if device_name in DEVICES_WITH_FUSED_ADAMW:
        kernels = replace(kernels, adam=functools.partial(torch.optim.AdamW, fused=True))
    if adaptor_kernels is not None:
        chosen = {name: getattr(adaptor_kernels, name, None) for name in ("attention", "layer_norm", "adam")}
        kernels = replace(kernels, **{name: kernel for name, kernel in chosen.items() if kernel is not None})
    return kernels
