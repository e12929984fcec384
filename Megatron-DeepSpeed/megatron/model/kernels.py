"""Which attention, layer-norm and Adam implementation each device uses.

The model asks this registry instead of importing device-specific kernels, so an adaptor package (the
Ascend `deepspeed_npu`) can plug in its fused kernels by calling `register_kernels("npu", ...)` at import
time, without patching any of our code.

Kernel contracts:
- attention(query, key, value, attention_mask, dropout_p) -> context. query/key/value/context are
  [batch, heads, seq, head_dim]; attention_mask is None for plain causal attention, or a bool tensor
  [batch, 1, seq, seq] where True means "may not attend" (Megatron's convention).
- layer_norm: a module class built as layer_norm(hidden_size, eps=epsilon).
- adam: called as adam(params, lr=..., betas=..., eps=..., weight_decay=...) like torch.optim.AdamW
  (decoupled weight decay, as Megatron's Adam), returning a torch.optim.Optimizer.
"""
import functools
from dataclasses import dataclass, replace
from typing import Callable, Dict, Optional

import torch
import torch.nn.functional as F

from megatron import device


def sdpa_attention(query, key, value, attention_mask, dropout_p):
    """PyTorch's scaled_dot_product_attention, which picks a flash / memory-efficient path by itself."""
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


class KernelRegistry:
    """Kernels per device name; a device nobody registered gets the portable PyTorch kernels."""

    def __init__(self):
        # torch's fused AdamW exists for CPU and CUDA and is ~9x faster than its default on CPU.
        fused_adam = replace(PORTABLE_KERNELS, adam=functools.partial(torch.optim.AdamW, fused=True))
        self._by_device: Dict[str, Kernels] = {"cpu": fused_adam, "cuda": fused_adam}

    def register(self, device_name: str, attention: Optional[Callable] = None,
                 layer_norm: Optional[type] = None, adam: Optional[Callable] = None) -> None:
        """Replace the given kernels of `device_name`; the ones passed as None stay as they were."""
        chosen = {name: kernel for name, kernel in
                  (("attention", attention), ("layer_norm", layer_norm), ("adam", adam)) if kernel is not None}
        self._by_device[device_name] = replace(self.kernels_for(device_name), **chosen)

    def kernels_for(self, device_name: str) -> Kernels:
        return self._by_device.get(device_name, PORTABLE_KERNELS)


REGISTRY = KernelRegistry()


def register_kernels(device_name: str, attention: Optional[Callable] = None,
                     layer_norm: Optional[type] = None, adam: Optional[Callable] = None) -> None:
    """Hook for adaptor packages: use these kernels whenever this process runs on `device_name`."""
    REGISTRY.register(device_name, attention=attention, layer_norm=layer_norm, adam=adam)


def attention_fn(device_name: Optional[str] = None) -> Callable:
    """Attention kernel for `device_name` (default: the device this process runs on)."""
    return REGISTRY.kernels_for(device_name or device.device_name()).attention


def layer_norm_cls(device_name: Optional[str] = None) -> type:
    """LayerNorm module class for `device_name` (default: the device this process runs on)."""
    return REGISTRY.kernels_for(device_name or device.device_name()).layer_norm


def adam_optimizer_cls(device_name: Optional[str] = None) -> Callable:
    """AdamW constructor for `device_name` (default: the device this process runs on); fused on CUDA."""
    return REGISTRY.kernels_for(device_name or device.device_name()).adam
