"""`python -m deepspeed_npu`: check this host's NPU set-up and say, in one line, what works or is missing.

Only looks: unlike activate() it sets no variable and registers no kernel. Exit status 0 when the NPUs
are ready or NPU support is simply not installed, 1 when the set-up is broken.
"""
import sys

from deepspeed_npu.environment import NOT_INSTALLED, NpuSetupError, chip_name, count_devices, import_torch_npu


def main() -> int:
    try:
        torch_npu = import_torch_npu()
        if torch_npu is None:
            print(NOT_INSTALLED)
            return 0
        count = count_devices(torch_npu)
    except NpuSetupError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"NPUs ready: {count} x {chip_name(torch_npu) or 'unnamed NPU'}")  # a short-lived check: device 0 is fine
    return 0


if __name__ == "__main__":
    sys.exit(main())
