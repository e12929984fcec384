"""The per-chip table (deepspeed_npu/chips.py): which generation a SoC name belongs to, the AdamW form the trainer
takes on each where op-plugin registers `_fused_adamw_` for every chip, and docs/ascend.md's table against it."""
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from deepspeed_npu.chips import GENERATIONS, OTHER, generation_of
from megatron.device_probe import DeviceFacts
from tools.launch_training import precision_flags

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("chip_name, generation", [
    ("Ascend910A", 0), ("Ascend910ProA", 0), ("Ascend910PremiumA", 0), ("Ascend910ProB", 0), ("Ascend910B", 0),
    ("Ascend910B1", 1), ("Ascend910B2C", 1), ("Ascend910B4-1", 1), ("Ascend910_9391", 2),
])
def test_soc_names_map_to_their_generation(chip_name, generation):
    assert generation_of(chip_name) is GENERATIONS[generation]


@pytest.mark.parametrize("chip_name", ["Ascend310P3", "Ascend950DT", "Ascend910B5", ""])
def test_other_chips_get_only_what_runs_everywhere(chip_name):
    assert generation_of(chip_name) is OTHER and not OTHER.fused_adamw and not OTHER.fused_kernels


# op-plugin declares `_fused_adamw_` for the npu backend on every chip (op_plugin_functions.yaml), so the dispatcher
# offers it even where its kernel, aclnnApplyAdamWV2, does not run (first-generation 910). In a fresh process: the
# PrivateUse1 backend renamed `npu` as torch_npu does, with a `_fused_adamw_` kernel registered for it.
ADAM_PER_CHIP = textwrap.dedent("""
    import types
    import torch
    torch.utils.rename_privateuse1_backend("npu")
    library = torch.library.Library("aten", "IMPL")
    library.impl("_fused_adamw_", lambda *args, **kwargs: None, "PrivateUse1")
    from deepspeed_npu.fused_kernels import npu_kernels
    from megatron.model.kernels import FUSED_ADAMW, FOREACH_ADAMW, select_kernels
    torch_npu = types.SimpleNamespace(npu_fusion_attention=lambda *args, **kwargs: None)
    for chip in ("Ascend910A", "Ascend910ProB", "Ascend910B3", "Ascend910_9391", "Ascend310P3", ""):
        adam = select_kernels("npu", npu_kernels(torch_npu, chip)).adam
        print(chip, "fused" if adam is FUSED_ADAMW else "foreach" if adam is FOREACH_ADAMW else adam)
""")


def test_the_fused_adamw_is_taken_only_on_chips_whose_kernel_runs_it():
    done = subprocess.run([sys.executable, "-c", ADAM_PER_CHIP], capture_output=True, text=True, check=True,
                          cwd=REPO, env={"PYTHONPATH": f"{REPO / 'DeepSpeed'}:{REPO / 'Megatron-DeepSpeed'}",
                                         "PATH": "/usr/bin:/bin"})
    assert done.stdout.splitlines() == ["Ascend910A foreach", "Ascend910ProB foreach", "Ascend910B3 fused",
                                        "Ascend910_9391 fused", "Ascend310P3 foreach", " foreach"]


def docs_row(generation) -> str:
    """The generation's row of docs/ascend.md's table, its precision the launcher's choice for the chip's answers."""
    chosen = precision_flags(DeviceFacts("npu", 8, generation.bf16, generation.fp16_overflow_visible, None), [])[0]
    precision = {("--bf16",): "bf16", ("--fp16",): "fp16, dynamic loss scaling", (): "fp32"}[tuple(chosen)]
    adam = "fused (`_fused_adamw_`)" if generation.fused_adamw else "foreach (no aclnnApplyAdamWV2)"
    kernels = "torch_npu's" if generation.fused_kernels else "PyTorch's"
    soc_names = generation.soc_names.replace("|", "\\|")  # a bar inside a table cell is escaped
    return (f"| {generation.name} | `{soc_names}` | {precision} | {generation.fp32_matmul} | {adam} | "
            f"{kernels} |")


def test_the_docs_table_says_what_the_code_chooses_on_each_generation():
    lines = (REPO / "docs" / "ascend.md").read_text().splitlines()
    header = lines.index("| Chip generation | SoC names | Precision chosen | fp32 matmuls | AdamW | Attention, "
                         "RMSNorm, rotary, SwiGLU |")
    rows = lines[header + 2:header + 2 + len(GENERATIONS)]
    assert rows == [docs_row(generation) for generation in GENERATIONS]
