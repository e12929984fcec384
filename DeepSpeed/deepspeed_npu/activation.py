"""activate(): the one call that puts DeepSpeed and the trainer on the NPUs when this host has them.

It only uses the extension points both sides offer (DeepSpeed's DS_ACCELERATOR variable; the trainer takes
the kernels it returns), so nothing is patched and a host without NPUs is left exactly as it was.
"""
from dataclasses import dataclass
from typing import Optional

from deepspeed_npu import accelerator_choice
from deepspeed_npu.environment import (NOT_INSTALLED, NpuSetupError, chip_name, count_devices, import_torch_npu,
                                      installed_version)


@dataclass(frozen=True)
class Activation:
    active: bool  # True: DeepSpeed and the trainer run on the NPUs with the NPU kernels
    summary: str  # one line that says what was done, or why NPU support stays off
    # The NPU's fused kernels (ChipKernels: attention attributes, None where torch_npu documents none for this
    # chip) for the trainer's megatron.model.kernels.select_kernels; None when NPU support is off.
    kernels: Optional[object] = None


class ChipKernels:
    """The fused kernels torch_npu documents for this rank's chip, chosen when the trainer first asks for them.

    Naming the chip initialises torch_npu's runtime on the current device, so it waits until the rank has bound
    its own NPU (the trainer does that before joining its process group); asked at activation, every rank of a
    node would first initialise device 0."""

    def __init__(self, torch_npu):
        self._torch_npu = torch_npu
        self._chosen = None

    def _kernels(self):
        if self._chosen is None:
            from deepspeed_npu.fused_kernels import npu_kernels  # needs torch: imported once torch_npu loaded
            self._chosen = npu_kernels(self._torch_npu, chip_name(self._torch_npu))
        return self._chosen

    def __getattr__(self, name):
        """The chosen NpuKernels' attributes (attention, inference_attention, rms_norm, ..., description)."""
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._kernels(), name)


def activate() -> Activation:
    """Switch to the NPUs if this host has working ones; call before anything imports DeepSpeed.
    Raises NpuSetupError when the host is meant to use NPUs but its set-up is incomplete.
    """
    requested = accelerator_choice.requested_accelerator()
    if requested not in (None, "npu"):
        return Activation(False, f"NPU support inactive: {accelerator_choice.ACCELERATOR_VARIABLE}={requested} "
                                 "selects another accelerator (unset it to train on the NPUs)")
    torch_npu = import_torch_npu()
    if torch_npu is None:
        if requested == "npu":
            raise NpuSetupError(f"{accelerator_choice.ACCELERATOR_VARIABLE}=npu asks for the NPUs, but torch_npu "
                                "is not installed: install the torch_npu release built for torch "
                                f"{installed_version('torch')} (on a host with the CANN toolkit), or unset "
                                f"{accelerator_choice.ACCELERATOR_VARIABLE}")
        return Activation(False, NOT_INSTALLED)
    count = count_devices(torch_npu)
    already_chosen = accelerator_choice.accelerator_already_chosen()
    if already_chosen not in (None, "npu"):
        raise NpuSetupError(f"DeepSpeed already chose its '{already_chosen}' accelerator before "
                            "deepspeed_npu.activate() ran, so it would not use the NPUs: call activate() "
                            "before the first `import deepspeed` (first thing in the entry script)")
    accelerator_choice.choose_npu()
    return Activation(True, f"NPU support active: {count} NPUs, DeepSpeed accelerator npu (hccl backend); "
                            "kernels chosen for the chip once each rank has bound its NPU", ChipKernels(torch_npu))
