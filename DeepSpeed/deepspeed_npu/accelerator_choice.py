"""Making DeepSpeed pick its NPU accelerator, without touching DeepSpeed.

DeepSpeed decides its accelerator once per process, the first time it is asked (`import deepspeed`
already asks), from the DS_ACCELERATOR environment variable or else by probing. So the choice must be
written to DS_ACCELERATOR before that first question; afterwards it can only be checked, not changed.
"""
import os
import sys
from typing import Optional

ACCELERATOR_VARIABLE = "DS_ACCELERATOR"


def requested_accelerator() -> Optional[str]:
    """The accelerator the user asked DeepSpeed for through DS_ACCELERATOR, if any."""
    return os.environ.get(ACCELERATOR_VARIABLE) or None


def accelerator_already_chosen() -> Optional[str]:
    """Device name of the accelerator DeepSpeed has already settled on in this process, or None.

    Reads DeepSpeed's cached choice without importing DeepSpeed: importing it would make the choice.
    """
    selector = sys.modules.get("deepspeed.accelerator.real_accelerator")
    chosen = getattr(selector, "ds_accelerator", None)
    return None if chosen is None else chosen.device_name()


def choose_npu() -> None:
    """Tell DeepSpeed (in this process and the processes it starts) to run on its NPU accelerator."""
    os.environ[ACCELERATOR_VARIABLE] = "npu"
