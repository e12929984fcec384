"""What each generation of Ascend chip can do for training: the one table the adaptor's kernel and optimizer
choices read and docs/ascend.md's "Per chip generation" table is checked against (DeepSpeed/tests/test_chips.py).

Sources (commits in docs/ARCHITECTURE.md, Ascend contract):
- SoC names and their order: torch_npu `torch_npu/csrc/core/npu/NpuVariables.cpp`; bf16 from Ascend910B1 on
  (`IsBF16Supported`); fp16 overflow gives inf/NaN (INF_NAN mode) from the same chips, saturates below them.
- The precision mode torch_npu sets at its first operator: `must_keep_origin_dtype` from Ascend910B1 on, else
  `allow_fp32_to_fp16`, under which the cube units run fp32 matmuls in fp16 (torch_npu
  `torch_npu/csrc/framework/LazyInitAclops.cpp`, `SetPrecisionMode`).
- `aclnnApplyAdamWV2`, the kernel of op-plugin's `_fused_adamw_`, supports Atlas A2 and A3 training series only,
  not the Atlas training series (first-generation 910) (hicann/ops-nn `optim/apply_adam_w_v2/docs/
  aclnnApplyAdamWV2.md`); op-plugin has no fallback for other chips.
- `npu_fusion_attention` (and the Llama kernels beside it): Atlas A2 training series (op-plugin
  `docs/zh/custom_APIs/torch_npu/torch_npu-npu_fusion_attention.md`).
"""
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class ChipGeneration:
    name: str
    soc_names: str  # regular expression over torch_npu's SoC names (get_device_name)
    bf16: bool  # torch_npu's is_bf16_supported()
    fp16_overflow_visible: bool  # is_support_inf_nan(): an fp16 overflow gives inf/NaN rather than saturating
    fp32_matmul: str  # what an fp32 matmul computes in under torch_npu's precision mode for the chip
    fused_adamw: bool  # op-plugin's _fused_adamw_ (aclnnApplyAdamWV2) runs here; else torch's foreach AdamW
    fused_kernels: bool  # npu_fusion_attention, npu_rms_norm, npu_rotary_mul, npu_swiglu documented for training


GENERATIONS = (
    ChipGeneration("Ascend 910, first generation (Atlas training series)", r"Ascend910(PremiumA|ProA|A|ProB|B)",
                   bf16=False, fp16_overflow_visible=False, fp32_matmul="fp16 (allow_fp32_to_fp16)",
                   fused_adamw=False, fused_kernels=False),
    ChipGeneration("Atlas A2 training series", r"Ascend910B(1|2|3|4)(C|-1)?", bf16=True, fp16_overflow_visible=True,
                   fp32_matmul="fp32 (must_keep_origin_dtype)", fused_adamw=True, fused_kernels=True),
    ChipGeneration("Atlas A3 training series", r"Ascend910_93\d\d", bf16=True, fp16_overflow_visible=True,
                   fp32_matmul="fp32 (must_keep_origin_dtype)", fused_adamw=True, fused_kernels=False),
)
# Any other chip (Ascend310P, Ascend950, an unnamed device): precision by the device's own answers, and only what
# works everywhere: torch's foreach AdamW, PyTorch's kernels.
OTHER = ChipGeneration("another or unnamed NPU", "", bf16=False, fp16_overflow_visible=False,
                       fp32_matmul="as torch_npu's precision mode for the chip", fused_adamw=False,
                       fused_kernels=False)


def generation_of(chip_name: str) -> ChipGeneration:
    """The generation of a SoC name torch_npu reports (e.g. "Ascend910B3"); OTHER when none matches."""
    return next((generation for generation in GENERATIONS if re.fullmatch(generation.soc_names, chip_name)), OTHER)
