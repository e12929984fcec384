"""What a launcher needs to know about this node's accelerators, asked in a short-lived child process.

Asking a device anything (bf16 support, memory) creates a device context, on device 0, that lives as long as the
process that asked; on NPUs with CANN before 8.3.RC1 it is a SetDevice(0). The launcher lives as long as the run,
so it never asks itself: a child (tools/device_facts.py) answers and exits, leaving every device to its rank.
"""
import json
import subprocess
import sys
from dataclasses import asdict, dataclass
from typing import Optional


@dataclass(frozen=True)
class DeviceFacts:
    name: str  # "cpu", "cuda" or "npu"
    count: int  # devices of that kind on this node (0 on the CPU)
    bf16: bool  # the device's own bf16 answer
    fp16_overflow_visible: bool  # an fp16 overflow shows as inf/NaN (False on NPUs in saturation mode)
    total_memory: Optional[int]  # bytes of one device; None on the CPU
    kv_repeated: bool = True  # grouped-query K/V repeated for the trainer's attention kernel here (its memory estimate)

    def to_json(self) -> str:
        return json.dumps(asdict(self))


CPU_FACTS = DeviceFacts("cpu", 0, False, True, None)


def read_device_facts() -> DeviceFacts:
    """This process's answers (so: only in a process that may hold a device context, such as the child)."""
    from megatron import device
    name = device.device_name()
    count = 0 if name == "cpu" else device.device_count()
    if count == 0:  # nothing more to ask (a launcher refuses an accelerator without devices in one line)
        return CPU_FACTS if name == "cpu" else DeviceFacts(name, 0, False, True, None)
    return DeviceFacts(name, count, device.bf16_supported(), device.fp16_overflow_visible(), device.total_memory())


def probe_device_facts(script: str) -> DeviceFacts:
    """The facts `script` prints as its last line of output; the lines before it (the adaptor's summary) are
    printed here, and its one-line error on stderr reaches the user directly. A failing child ends the launcher
    with its status, its own line being the one the user reads."""
    done = subprocess.run([sys.executable, script], stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise SystemExit(done.returncode)
    *said, facts = done.stdout.strip().splitlines()
    for line in said:
        print(line, flush=True)
    return DeviceFacts(**json.loads(facts))
