"""Finding torch_npu and the NPUs, and saying in plain words what is missing when that fails.

torch_npu fails in ways that read as riddles (a missing libhccl.so surfacing as a failed `import torch`,
an undefined C++ symbol). Each failure here becomes one NpuSetupError that names the missing piece and
the command that fixes it, so a user on an Ascend host never has to decode a native traceback.
"""
import importlib
import importlib.metadata
import os
import re
from types import ModuleType
from typing import Iterator, Optional

from megatron.errors import InputError

CANN_SET_ENV = "/usr/local/Ascend/ascend-toolkit/set_env.sh"
# Shared libraries of the Ascend driver (the rest that torch_npu loads come from the CANN toolkit).
DRIVER_LIBRARIES = ("libascend_hal", "libdrvdsmi_host", "libdcmi")
NOT_INSTALLED = "NPU support inactive: torch_npu is not installed"
SHARED_LIBRARY = re.compile(r"\b(lib[\w+\-.]*?\.so(?:\.[\d.]+)?)\b")


class NpuSetupError(InputError):
    """The machine is meant to train on NPUs but its software set-up is incomplete; says what to fix."""


def installed_version(distribution: str) -> str:
    """Version of an installed package, read from its metadata so nothing (and no native code) is imported."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def import_torch_npu() -> Optional[ModuleType]:
    """torch_npu, or None when it is not installed; an installed but broken torch_npu raises NpuSetupError."""
    try:
        return importlib.import_module("torch_npu")
    except ModuleNotFoundError as err:
        if err.name == "torch_npu":
            return None
        raise NpuSetupError(explain_import_failure(err)) from err
    except Exception as err:  # native loaders raise ImportError, OSError or RuntimeError: all mean "broken"
        raise NpuSetupError(explain_import_failure(err)) from err


def _error_chain(err: BaseException) -> Iterator[BaseException]:
    """The error and every error it was raised from (torch wraps the real cause in its own RuntimeError)."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__


def explain_import_failure(err: BaseException) -> str:
    """Plain-words diagnosis of a failed `import torch_npu` (or of `import torch`, which loads torch_npu
    by itself when it is installed): what is missing and how to fix it."""
    chain = list(_error_chain(err))
    root_cause = chain[-1]
    detail = f"({type(root_cause).__name__}: {root_cause})"
    torch_version = installed_version("torch")
    for error in chain:
        message = str(error)
        if "undefined symbol" in message:
            return (f"torch_npu {installed_version('torch-npu')} does not fit the installed torch "
                    f"{torch_version} {detail}: install the torch_npu release built for torch {torch_version} "
                    "(same major.minor version) and the CANN toolkit it requires")
        library = SHARED_LIBRARY.search(message) if "cannot open shared object file" in message else None
        if library and library.group(1).startswith(DRIVER_LIBRARIES):
            return (f"torch_npu cannot load the Ascend driver library {library.group(1)} {detail}: install the "
                    "Ascend NPU driver and firmware (check with `npu-smi info`) and make sure "
                    "/usr/local/Ascend/driver/lib64 is on LD_LIBRARY_PATH, e.g. by `source test/env_npu.sh`")
        if library:
            return (f"torch_npu cannot load the CANN library {library.group(1)} {detail}: the CANN toolkit's "
                    f"environment is not set. Run `source {CANN_SET_ENV}` (or `source test/env_npu.sh`, which "
                    "does it) before starting. If CANN is not installed, install the CANN toolkit release that "
                    "your torch_npu release requires; on a machine without NPUs, uninstall torch_npu instead "
                    "(`pip uninstall torch-npu`): without CANN it breaks `import torch`")
        if isinstance(error, ModuleNotFoundError) and error.name and error.name.split(".")[0] != "torch_npu":
            return (f"torch_npu needs the Python module '{error.name}', which is not installed {detail}: "
                    f"install it with pip into this environment, then retry")
    return (f"torch_npu is installed but fails to import {detail}. Check that CANN's environment is set "
            f"(`source {CANN_SET_ENV}` or `source test/env_npu.sh`) and that torch_npu "
            f"{installed_version('torch-npu')} is the release built for torch {torch_version}")


def count_devices(torch_npu: ModuleType) -> int:
    """How many NPUs this process can use, asked without initialising torch_npu's runtime (which would bind the
    current device, device 0, before the rank binds its own); none, or a failing driver query, raises
    NpuSetupError."""
    try:
        count = torch_npu.npu.device_count() if torch_npu.npu.is_available() else 0
    except Exception as err:  # the driver query itself failed: report it like a missing device
        raise NpuSetupError(_no_device_message(f" (asking for devices failed: {type(err).__name__}: {err})")) \
            from err
    if count < 1:
        raise NpuSetupError(_no_device_message(""))
    return count


def chip_name(torch_npu: ModuleType) -> str:
    """The SoC name of the current NPU (e.g. "Ascend910B3"), "" when torch_npu cannot tell. Asking initialises
    torch_npu's runtime on the current device: in a rank, only once its own device is bound."""
    try:
        return str(torch_npu.npu.get_device_name(torch_npu.npu.current_device()))
    except Exception:  # the name only picks kernels: an unnamed chip keeps the portable ones
        return ""


def _no_device_message(detail: str) -> str:
    visible = os.environ.get("ASCEND_RT_VISIBLE_DEVICES")
    hints = ["check that `npu-smi info` lists the NPUs (Ascend driver installed and loaded)",
             "that a container was started with the /dev/davinci* devices"]
    if visible is not None:
        hints.append(f"that ASCEND_RT_VISIBLE_DEVICES={visible!r} names devices that exist")
    if not (os.environ.get("ASCEND_TOOLKIT_HOME") or os.environ.get("ASCEND_HOME_PATH")):  # set by set_env.sh
        hints.append(f"and that CANN's environment is set (`source {CANN_SET_ENV}` or `source test/env_npu.sh`)")
    return (f"torch_npu {installed_version('torch-npu')} is installed but sees no NPU{detail}: "
            + ", ".join(hints) + "; to train on the CPU on this machine instead, set DS_ACCELERATOR=cpu")
