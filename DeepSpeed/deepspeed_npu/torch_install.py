"""Whether set-up may install torch, or must keep the one this environment has: `python -m
deepspeed_npu.torch_install HOST_KIND` prints `reuse` or `install`, or says in one line what to fix.

tools/setup_env.sh asks before it installs anything. An installed torch is never replaced: where it fails to
import (on an Ascend host, usually CANN's environment not loaded, since `import torch` loads torch_npu), a fresh
torch in the project's environment would shadow the build torch_npu was made for and break every later run. On an
Ascend host set-up installs no torch at all: only the torch releases torch_npu lists fit it (its compatibility table
at Ascend/pytorch 9e73e70 ends at torch 2.12, below requirements.txt's 2.13.0).
"""
import importlib
import importlib.metadata
import sys
from typing import Optional

from deepspeed_npu.environment import NpuSetupError, explain_import_failure

# The oldest torch with every API the trainer uses; the newest of them is torch.nn.RMSNorm (torch 2.4).
MINIMUM_TORCH = (2, 4)
HOST_KINDS = ("ascend", "nvidia", "cpu")


def release(version: str) -> tuple:
    """(major, minor) of a version string such as "2.6.0+cpu" or "2.6.0.post3"."""
    major, minor = version.split(".")[:2]
    return int(major), int("".join(digit for digit in minor if digit.isdigit()) or 0)


def plan(host: str, torch_version: Optional[str], torch_npu_version: Optional[str],
         import_error: Optional[BaseException]) -> str:
    """"reuse" or "install" for a host of kind `host` whose environment holds `torch_version` (None: no torch) and
    `torch_npu_version` (None: none), `import torch` having raised `import_error` (None: it worked); NpuSetupError
    when set-up must stop, saying what to fix."""
    if torch_version is None:
        if host == "ascend":
            raise NpuSetupError("no torch in this environment, and set-up installs none on an Ascend host: install "
                                "the torch release your torch_npu and CANN support, then torch_npu (docs/ascend.md), "
                                "and run set-up again")
        return "install"
    if torch_npu_version is not None and release(torch_npu_version) != release(torch_version):
        raise NpuSetupError(f"torch {torch_version} does not fit torch_npu {torch_npu_version}, built for torch "
                            f"{'.'.join(map(str, release(torch_npu_version)))}: if an earlier set-up installed this "
                            f"torch into the project's environment, remove it there (`{sys.executable} -m pip "
                            "uninstall torch`) so the system's torch is seen again, or install the matching pair")
    if import_error is not None:
        raise NpuSetupError(f"torch {torch_version} is installed but fails to import, and set-up never replaces an "
                            f"installed torch: {explain_import_failure(import_error)}")
    if release(torch_version) < MINIMUM_TORCH:
        raise NpuSetupError(f"torch {torch_version} is older than {'.'.join(map(str, MINIMUM_TORCH))}, the oldest "
                            "with every API the trainer uses (torch.nn.RMSNorm): install a newer torch (on Ascend, "
                            "with its torch_npu)")
    return "reuse"


def _version(distribution: str) -> Optional[str]:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0] not in HOST_KINDS:
        raise NpuSetupError(f"usage: python -m deepspeed_npu.torch_install {'|'.join(HOST_KINDS)}")
    try:
        importlib.import_module("torch")
        import_error = None
    except Exception as err:  # a native loader's ImportError, OSError or torch's wrapping RuntimeError
        import_error = err
    print(plan(argv[0], _version("torch"), _version("torch-npu") or _version("torch_npu"), import_error))


if __name__ == "__main__":
    from megatron.errors import run_cli
    run_cli(main)
