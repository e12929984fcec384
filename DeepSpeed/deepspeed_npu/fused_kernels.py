"""torch_npu's fused attention, RMSNorm, rotary embedding and SwiGLU, shaped to the contracts of the trainer's
megatron/model/kernels.py.

The model calls attention as (query, key, value, spec) on [batch, heads, seq, dim] tensors, the spec being the
trainer's AttentionSpec (megatron/model/attention_spec.py, read here by its fields: causal, window_size,
segment_ids, dropout_p, softmax_scale). Every case runs on one of the kernel's own sparse modes, each of which
reads a fixed 2048 x 2048 compressed causal mask (True above the diagonal = not computed) instead of a
[seq, seq] one, so long sequences cost no mask memory: plain causal attention in leftUpCausal mode (2); a
sliding window of w earlier keys in band mode (4) with pre_tockens w and next_tockens 0; packed documents in the
TND layout (the batch's rows laid end to end, one varlen sequence per document, actual_seq_qlen /
actual_seq_kvlen their cumulative ends) in rightDownCausal mode (3), or band mode with a window.

Only what torch_npu documents is used (op-plugin's docs/zh/custom_APIs/torch_npu/
torch_npu-npu_fusion_attention.md): the kernel is for training (its notes say it is used in training only)
on Atlas A2 training chips, so inference and evaluation keep PyTorch's SDPA, and so does every other chip
(first-generation Ascend 910, Ascend310P, the Ascend910_93xx of Atlas A3, an unnamed device): chips.py's table.
The optimizer is the trainer's rule (torch's AdamW, fused through op-plugin's `_fused_adamw_` where the
dispatcher has it); the adaptor only says, from the same table, where that kernel cannot run (aclnnApplyAdamWV2
is not supported on first-generation 910), so the trainer takes the foreach form there. torch_npu's NpuFusedAdamW
is never offered: it copies the gradients into buffers of its own on its first step, so it misses DeepSpeed's
fresh `.grad` tensors, and DeepSpeed's ZeRO refuses it.

The Llama kernels (op-plugin's op_plugin_functions.yaml schemas and derivatives.yaml backward formulas; their
docs in docs/zh/custom_APIs/torch_npu/): `npu_rms_norm(self, gamma, epsilon)` returns (y, rstd) with y =
x / sqrt(mean(x^2) + eps) * gamma over gamma's trailing dims (also Qwen3's per-head query/key norms: x the
[batch, heads, seq, head_dim] view, gamma [head_dim]; the operator takes non-contiguous input);
`npu_rotary_mul(self, r1, r2, rotary_mode='half')` is x * r1 + rotate_half(x) * r2 in its half mode, x BSND with r1 / r2 1S1D, or BS1D where the position ids differ between rows, as called
here (BNSD with 11SD / B1SD also documented); `npu_swiglu(self, dim)` halves `self` along `dim` into A, B
and returns swish(A) * B, which is the trainer's layout as it comes: each tensor-parallel rank's dense_h_to_4h
output is its [gate_r; up_r] halves (upstream Megatron-DeepSpeed's), halved along the last dim (no copy). Each is used on the same Atlas A2 chips as the fused attention (npu_swiglu's
documentation lists only those; the other two list more, which are left portable until they are tried).
"""
import math
from dataclasses import dataclass
from types import ModuleType
from typing import Callable, Dict, Optional

import torch

from deepspeed_npu.chips import generation_of

# npu_fusion_attention's sparse_mode values (torch_npu documentation).
NO_MASK = 0  # with atten_mask None: every key computed
TOP_LEFT_CAUSAL = 2
BOTTOM_RIGHT_CAUSAL = 3
BAND = 4  # keys from pre_tockens before to next_tockens after each query, from the bottom-right corner
COMPRESSED_CAUSAL_MASK_SIZE = 2048
MAX_VARLEN_SEQUENCES = 1024  # actual_seq_qlen's longest list in the varlen (TND) case
DOCUMENTED_CHIPS = "Atlas A2 training chips (Ascend910B1-B4)"  # the kernels' documented products (chips.py)


class FusionAttention:
    """Megatron's attention contract on top of torch_npu.npu_fusion_attention, in the layouts the operator takes
    natively. The model's query, key and value are [batch, heads, seq, dim] views of its [batch, seq, heads, dim]
    projection output: handed over as BSND (transposed back, no copy) instead of as BNSD views that CANN would
    copy into BNSD order on every call, and the output, BSND, is returned as a BNSD view, so the model's
    transpose back to [batch, seq, hidden] is free. Grouped-query key/value come with their own head count
    (`takes_grouped_kv`): the operator takes Nq a whole multiple of Nkv, so no K/V repeat is made."""
    kernel_name = "torch_npu.npu_fusion_attention"
    takes_grouped_kv = True

    def __init__(self, fusion_attention: Callable):
        self._fusion_attention = fusion_attention
        self._causal_masks: Dict[torch.device, torch.Tensor] = {}  # built once per device, reused every call

    def __call__(self, query, key, value, spec):
        if query.shape[2] != key.shape[2]:
            raise ValueError("torch_npu.npu_fusion_attention is the training kernel: queries and keys must cover the "
                             "same positions (generation uses the inference attention)")
        options = dict(scale=spec.softmax_scale or 1.0 / math.sqrt(query.shape[-1]), keep_prob=1.0 - spec.dropout_p)
        if not spec.causal:
            options.update(atten_mask=None, sparse_mode=NO_MASK)
        elif spec.window_size is not None:
            options.update(atten_mask=self._causal_mask(query.device), sparse_mode=BAND,
                           pre_tockens=spec.window_size, next_tockens=0)
        else:
            options.update(atten_mask=self._causal_mask(query.device),
                           sparse_mode=TOP_LEFT_CAUSAL if spec.segment_ids is None else BOTTOM_RIGHT_CAUSAL)
        query_bsnd, key_bsnd, value_bsnd = (tensor.transpose(1, 2) for tensor in (query, key, value))
        if spec.segment_ids is None:
            outputs = self._fusion_attention(query_bsnd, key_bsnd, value_bsnd, query.shape[1], "BSND", **options)
            return outputs[0].transpose(1, 2)  # the rest are softmax statistics and RNG state for the backward pass
        # TND: [batch * seq, heads, dim], one varlen sequence per document (key/value with their own head count).
        batch, heads, length, _ = query.shape
        ends = spec.document_ends()
        if len(ends) > MAX_VARLEN_SEQUENCES:
            raise ValueError(f"{len(ends)} documents in one micro-batch; torch_npu.npu_fusion_attention's TND layout "
                             f"takes at most {MAX_VARLEN_SEQUENCES}: lower --micro-batch-size or --seq-length")
        tokens = (bsnd.reshape(batch * length, bsnd.shape[2], -1) for bsnd in (query_bsnd, key_bsnd, value_bsnd))
        context = self._fusion_attention(*tokens, heads, "TND", actual_seq_qlen=ends, actual_seq_kvlen=ends,
                                         **options)[0]
        return context.view(batch, length, heads, -1).transpose(1, 2)

    def _causal_mask(self, device: torch.device) -> torch.Tensor:
        if device not in self._causal_masks:
            size = COMPRESSED_CAUSAL_MASK_SIZE
            self._causal_masks[device] = torch.ones(size, size, dtype=torch.bool, device=device).triu(diagonal=1)
        return self._causal_masks[device]


def npu_rms_norm_class(rms_norm: Callable) -> type:
    """torch.nn.RMSNorm (its weight, normalized_shape and eps) computed by torch_npu.npu_rms_norm."""

    class NpuRMSNorm(torch.nn.RMSNorm):
        kernel_name = "torch_npu.npu_rms_norm"

        def forward(self, hidden: torch.Tensor) -> torch.Tensor:
            return rms_norm(hidden, self.weight, epsilon=self.eps)[0]  # the second output is rstd, for backward
    return NpuRMSNorm


class RotaryMul:
    """kernels.rotary_mul by torch_npu.npu_rotary_mul in its half mode, given BSND x (1S1D cos and sin, or BS1D where
    the position ids differ between rows): the model's [batch, heads, seq, dim] query and key are views of its
    [batch, seq, heads, dim] projection, so transposed back they are in the layout the operator reads them in
    (non-contiguous input allowed), and the result is returned as the same kind of view."""
    kernel_name = "torch_npu.npu_rotary_mul"

    def __init__(self, rotary_mul: Callable):
        self._rotary_mul = rotary_mul

    def __call__(self, x, cos, sin):
        x_bsnd, cos_1s1d, sin_1s1d = (tensor.transpose(1, 2) for tensor in (x, cos, sin))
        return self._rotary_mul(x_bsnd, cos_1s1d, sin_1s1d, rotary_mode="half").transpose(1, 2)


class SwiGLU:
    """kernels.swiglu by torch_npu.npu_swiglu: the [..., (gate, up)] halves of the last dim, as the kernel takes them."""
    kernel_name = "torch_npu.npu_swiglu"

    def __init__(self, swiglu: Callable):
        self._swiglu = swiglu

    def __call__(self, inner):
        return self._swiglu(inner, dim=-1)


@dataclass(frozen=True)
class NpuKernels:
    attention: Optional[Callable]  # for training; None: keep the portable PyTorch kernel
    why_portable: str = ""  # why the kernels stay portable, when they do
    inference_attention: Optional[Callable] = None  # none documented that fits: generation keeps SDPA
    rms_norm: Optional[type] = None  # None where this torch_npu lacks the operator: torch's
    rotary_mul: Optional[Callable] = None
    swiglu: Optional[Callable] = None
    fused_adamw: bool = False  # op-plugin's _fused_adamw_ runs on this chip (chips.py); else the foreach AdamW

    def description(self) -> str:
        if not self.attention:
            return f"PyTorch SDPA attention ({self.why_portable})"
        fused = [name for name, kernel in (("RMSNorm", self.rms_norm), ("rotary", self.rotary_mul),
                                           ("SwiGLU", self.swiglu)) if kernel is not None]
        return ("torch_npu fused attention for training, PyTorch SDPA for inference"
                + (f"; torch_npu {', '.join(fused)}" if fused else ""))


def npu_kernels(torch_npu: ModuleType, chip_name: str) -> NpuKernels:
    """The kernels this torch_npu build documents for this chip; otherwise the portable ones, and why."""
    generation = generation_of(chip_name)
    fusion_attention = getattr(torch_npu, "npu_fusion_attention", None)
    if fusion_attention is None:
        return NpuKernels(None, "this torch_npu has no npu_fusion_attention", fused_adamw=generation.fused_adamw)
    if not generation.fused_kernels:
        return NpuKernels(None, f"torch_npu documents npu_fusion_attention for {DOCUMENTED_CHIPS}, "
                                f"not for {chip_name!r}", fused_adamw=generation.fused_adamw)
    rms_norm, rotary_mul, swiglu = (getattr(torch_npu, name, None)
                                    for name in ("npu_rms_norm", "npu_rotary_mul", "npu_swiglu"))
    return NpuKernels(FusionAttention(fusion_attention), rms_norm=rms_norm and npu_rms_norm_class(rms_norm),
                      rotary_mul=rotary_mul and RotaryMul(rotary_mul), swiglu=swiglu and SwiGLU(swiglu),
                      fused_adamw=generation.fused_adamw)
