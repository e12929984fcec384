"""Which attention, layer-norm and Adam implementation a run uses, chosen once when the model is built.

The model never looks kernels up: `select_kernels` picks them for the device (plus whatever an adaptor
package such as the Ascend `deepspeed_npu` offers) and the result is passed into the model's config and the
optimizer. Nothing is registered globally, so two models in one process can use different kernels.

Kernel contracts:
- attention(query, key, value, spec) -> context. query/key/value/context are [batch, heads, seq, head_dim]; spec is
  a model/attention_spec.AttentionSpec: causal, sliding window, packed documents (segment_ids), dropout
  probability and softmax scale. When generating with a KV cache, key/value hold more positions than query, the
  queries being the last of them. Every implementation honours every field of the spec, or refuses it in one line.
  Under grouped-query attention key/value come repeated to the query's heads, unless the kernel has
  `takes_grouped_kv` True: then they keep their own (fewer) heads, each serving a block of consecutive query heads.
  `repeats_grouped_kv` is the one place that reads it: the model (gpt.py, ulysses.py) and the layout planner's
  activation count (planning/memory.py) both ask it.
- layer_norm, rms_norm: module classes built as layer_norm(hidden_size, eps=epsilon) (--normalization picks one);
  an RMSNorm has a `weight` and no `bias`, and torch.nn.RMSNorm's `normalized_shape` and `eps`.
- rotary_mul(x, cos, sin) -> x * cos + rotate_half(x) * sin, x [batch, heads, seq, dim] and cos / sin
  [batch or 1, 1, seq, dim] (model/rotary.py: a row per row of position ids): rotate_half(x) is (-second half,
  first half) of the last dim.
- swiglu(inner) -> SiLU(gate) * up, where inner's last dim holds them as halves: [..., (gate, up)], gate first (a
  tensor-parallel rank's [gate_r; up_r], upstream Megatron-DeepSpeed's layout).
- adam: called as adam(params, lr=..., betas=..., eps=..., weight_decay=...) like torch.optim.AdamW
  (decoupled weight decay, as Megatron's Adam), returning a torch.optim.Optimizer.
- loss_chunk_bytes: the fp32 temporaries per row chunk of the loss (model/cross_entropy.py): on a CPU a few MiB,
  so they stay in its cache and reuse the same pages each step; elsewhere large enough for full-speed kernels.
- loss_kernels: the loss's per-chunk math (model/cross_entropy.ChunkKernels), eager or compiled. On CUDA it is
  compiled even in an eager run: eager, each chunk is converted to fp32, softmaxed in several passes and softmaxed
  again in backward (on one H200, 17 ms of a 345M micro-batch's 105 ms at micro batch 16); compiled, each pass
  reads the bf16 logits once (docs/benchmarks.md).

The Adam rule is the same on every device: torch's AdamW, fused where the device's backend registers the
`_fused_adamw_` kernel (CPU, CUDA; op-plugin registers it for Ascend NPUs) and the adaptor does not say that its
chip cannot run it (`fused_adamw` False: op-plugin's kernel is aclnnApplyAdamWV2, which first-generation Ascend 910
lacks), else its foreach form. No adaptor can substitute another optimizer. Both are on DeepSpeed's list of ZeRO-supported optimizers and read each parameter's current
`.grad` at every step; optimizers that copy the gradients into buffers of their own on the first step (such as
torch_npu's NpuFusedAdamW) train on stale gradients once DeepSpeed hands them fresh `.grad` tensors.
An adaptor's attention kernel is a training kernel: inference and evaluation take the adaptor's
`inference_attention` where it offers one, else SDPA.
"""
import functools
from dataclasses import dataclass, replace
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch.nn.attention import flex_attention
from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

from megatron.model.attention_spec import AttentionSpec
from megatron.model.cross_entropy import CHUNK_BYTES, EAGER_CHUNK_KERNELS, ChunkKernels, compiled_chunk_kernels


def sdpa_attention(query, key, value, spec: AttentionSpec):
    """PyTorch's scaled_dot_product_attention, which picks a flash / memory-efficient path by itself. Plain causal
    attention passes no mask, so the flash kernel is eligible; a window or packed documents take the spec's mask,
    built here for this call."""
    scale = spec.scale(query.shape[-1])
    if spec.plain_causal and query.shape[-2] == key.shape[-2]:
        return F.scaled_dot_product_attention(query, key, value, dropout_p=spec.dropout_p, is_causal=True,
                                              scale=scale)
    mask = spec.allowed(query.shape[-2], key.shape[-2], query.device)
    return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=spec.dropout_p, scale=scale)


class FlexAttention:
    """sdpa_attention, except that a window or packed documents in training shapes (as many queries as keys, no
    dropout) run through torch's FlexAttention with a block mask of the spec's rule: only the blocks the rule
    leaves visible are computed, and no [batch, 1, seq, seq] mask exists. FlexAttention has no dropout, so
    attention dropout keeps SDPA's masked path. The block mask of the last batch is kept: every layer of a forward
    (and its recomputation) attends over the same documents."""
    kernel_name = "flex_attention"

    def __init__(self, compiled: bool = True):
        """compiled False: FlexAttention's eager path, which computes every score (what CPU tests can run: the
        compiled CPU kernel takes a minute to build and has no backward)."""
        self._flex = (torch.compile(flex_attention.flex_attention, dynamic=False) if compiled
                      else flex_attention.flex_attention)
        self._last = (None, None, None)  # (causal, window, length), segment ids, their block mask

    def __call__(self, query, key, value, spec: AttentionSpec):
        if spec.plain_causal or spec.dropout_p > 0 or query.shape[-2] != key.shape[-2]:
            return sdpa_attention(query, key, value, spec)
        return self._flex(query, key, value, block_mask=self._block_mask(spec, query),
                              scale=spec.scale(query.shape[-1]))

    def _block_mask(self, spec: AttentionSpec, query):
        rule, length = (spec.causal, spec.window_size, query.shape[-2]), query.shape[-2]
        kept_rule, kept_segments, block_mask = self._last
        if kept_rule != rule or kept_segments is not spec.segment_ids:
            batch = 1 if spec.segment_ids is None else query.shape[0]
            block_mask = flex_attention.create_block_mask(lambda b, h, q, k: spec.sees(b, q, k), batch, None,
                                                          length, length, device=query.device)
            self._last = (rule, spec.segment_ids, block_mask)
        return block_mask


# Where FlexAttention trains (its backward runs on CUDA; its CPU path is forward-only in torch 2.13).
FLEX_ATTENTION_DEVICES = frozenset({"cuda"})
# Where the loss's chunk math is compiled in every run (inductor's Triton kernels; on a CPU the eager chunks, sized
# to its cache, were as fast: tools/benchmark_cross_entropy.py).
COMPILED_LOSS_DEVICES = frozenset({"cuda"})


def rotate_half_mul(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-second, first), dim=-1) * sin


def repeats_grouped_kv(attention: Callable) -> bool:
    """Whether grouped-query key/value heads are repeated to the query heads before `attention` is called: the
    repeated copies are kept for backward, so the planner counts them exactly where the model makes them."""
    return not getattr(attention, "takes_grouped_kv", False)


def halves_swiglu(inner: torch.Tensor) -> torch.Tensor:
    gate, up = inner.chunk(2, dim=-1)
    return F.silu(gate) * up


@dataclass(frozen=True)
class Kernels:
    attention: Callable
    layer_norm: type
    adam: Callable
    rms_norm: type = torch.nn.RMSNorm
    rotary_mul: Callable = None  # None: rotate_half_mul (set in __post_init__, as the functions come below)
    swiglu: Callable = None  # None: halves_swiglu
    loss_chunk_bytes: int = CHUNK_BYTES
    loss_kernels: ChunkKernels = EAGER_CHUNK_KERNELS

    def __post_init__(self):
        for name, portable in (("rotary_mul", rotate_half_mul), ("swiglu", halves_swiglu)):
            if getattr(self, name) is None:
                object.__setattr__(self, name, portable)

    def description(self) -> str:
        """What was chosen, for the start-up log line: e.g. "attention sdpa_attention, AdamW(fused=True)"."""
        return f"attention {self.attention_name()}, {_kernel_name(self.adam)}"

    def attention_name(self) -> str:
        return _kernel_name(self.attention)


def _kernel_name(kernel: Callable) -> str:
    if isinstance(kernel, functools.partial):
        options = ", ".join(f"{name}={value}" for name, value in kernel.keywords.items())
        return f"{_kernel_name(kernel.func)}({options})"
    return getattr(kernel, "kernel_name", None) or getattr(kernel, "__name__", type(kernel).__name__)


def fused_adamw_available(device_type: str) -> bool:
    """Whether torch's AdamW(fused=True) can step parameters on `device_type`: torch lists the device type
    among its fused-optimizer devices and the dispatcher holds a `_fused_adamw_` kernel for its backend
    (an out-of-tree backend such as torch_npu registers its kernels under PrivateUse1)."""
    try:
        dispatch_key = torch._C._dispatch_key_for_device(device_type)
    except RuntimeError:  # a device type this process's torch does not know (e.g. npu without torch_npu)
        return False
    return (device_type in _get_fused_kernels_supported_devices()
            and torch._C._dispatch_has_kernel_for_dispatch_key("aten::_fused_adamw_", dispatch_key))


# torch's AdamW in its two multi-tensor forms; both read every parameter's current gradient at each step.
FUSED_ADAMW = functools.partial(torch.optim.AdamW, fused=True)
FOREACH_ADAMW = functools.partial(torch.optim.AdamW, foreach=True)

# Where the fused AdamW kernel skips a step when given `found_inf` (torch's CPU and CUDA kernels). op-plugin's NPU
# kernel takes the argument but does not read it (op_plugin/ops/opapi/FusedAdamWKernelNpuOpApi.cpp; torch_npu's
# torch.optim.AdamW documentation says the same).
FUSED_ADAMW_READS_FOUND_INF = frozenset({"cpu", "cuda"})


def step_reads_found_inf(optimizer, device_type: str, devices: frozenset = FUSED_ADAMW_READS_FOUND_INF) -> bool:
    """Whether `optimizer`'s next step skips itself on the device given `found_inf`: every parameter group fused
    (a group's own switch decides, and a loaded state dict may bring groups saved with another), on a device
    whose fused kernel reads it."""
    return device_type in devices and all(group.get("fused") for group in optimizer.param_groups)

PORTABLE_KERNELS = Kernels(attention=sdpa_attention, layer_norm=torch.nn.LayerNorm, adam=FOREACH_ADAMW)
CPU_LOSS_CHUNK_BYTES = 1 << 22  # 4 MiB: of 256 KiB-256 MiB, 1-4 MiB ran fastest at 512-2048 rows of 8192-50304 logits


def select_kernels(device_name: str, adaptor_kernels: Optional[object] = None, training: bool = True) -> Kernels:
    """The kernels for `device_name`: PyTorch's, with AdamW fused where the device has the kernel, and the
    attention / layer_norm / rms_norm / rotary_mul / swiglu kernels that `adaptor_kernels` provides (attributes;
    None = keep ours) taking precedence. With `training` False the adaptor's `inference_attention` replaces its
    training attention; its `fused_adamw` False keeps AdamW in its foreach form. On a CPU the loss works in
    cache-sized chunks; on CUDA its chunk math is compiled."""
    fused = fused_adamw_available(device_name) and getattr(adaptor_kernels, "fused_adamw", True)
    kernels = replace(PORTABLE_KERNELS, adam=FUSED_ADAMW if fused else FOREACH_ADAMW)
    if device_name == "cpu":
        kernels = replace(kernels, loss_chunk_bytes=CPU_LOSS_CHUNK_BYTES)
    if device_name in FLEX_ATTENTION_DEVICES:
        kernels = replace(kernels, attention=FlexAttention())
    if device_name in COMPILED_LOSS_DEVICES:
        kernels = replace(kernels, loss_kernels=compiled_chunk_kernels())
    if adaptor_kernels is not None:
        attention = getattr(adaptor_kernels, "attention" if training else "inference_attention", None)
        chosen = {"attention": attention, **{name: getattr(adaptor_kernels, name, None)
                                             for name in ("layer_norm", "rms_norm", "rotary_mul", "swiglu")}}
        kernels = replace(kernels, **{name: kernel for name, kernel in chosen.items() if kernel is not None})
    return kernels
