"""Ascend NPU support for DeepSpeed and the Megatron-DeepSpeed trainer, without patching either.

    from deepspeed_npu import activate
    print(activate().summary)   # first thing in the entry script, before anything imports DeepSpeed

On a host with working NPUs this makes DeepSpeed use its NPU accelerator (hccl) and gives the trainer
torch_npu's fused attention and fused AdamW; elsewhere it changes nothing. A broken set-up (torch_npu
without CANN, no visible device) raises NpuSetupError, which says what is missing and how to fix it.
`python -m deepspeed_npu` runs the same checks and only reports.
Importing this package imports neither torch nor torch_npu.
"""
from deepspeed_npu.activation import Activation, activate
from deepspeed_npu.environment import NpuSetupError, explain_import_failure

__all__ = ["Activation", "activate", "NpuSetupError", "explain_import_failure"]
