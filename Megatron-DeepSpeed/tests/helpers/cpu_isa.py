"""Which CPU kernels the tests' bf16/fp16 arithmetic runs on. ATen picks its vectorized kernels (AVX512 or AVX2)
and oneDNN its instruction set (AVX512-BF16 and AMX where the CPU has them) once per process, from the CPU unless
these variables cap them; the two paths round bf16 sums differently, so a tolerance that holds on one CPU can fail
on the next (issue 48). `--cpu-isa avx2` runs the tests, and every process they start, as on a CPU without AVX512."""
import os
import tempfile

import torch

# The variables' values for each choice, and the ATen capability each must give. Inductor's kernels compiled under
# the cap go to a cache of their own: loading kernels that a run without it compiled aborts the process.
CAPS = {"default": ({}, None),
        "avx2": ({"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
                  "TORCHINDUCTOR_CACHE_DIR": os.path.join(tempfile.gettempdir(), "torchinductor_avx2")}, "AVX2")}


def force(choice: str) -> str:
    """Cap this process's kernels (and those of the processes it starts, which inherit the variables) at `choice`,
    before any kernel has run; returns the capability ATen then reports."""
    variables, expected = CAPS[choice]
    os.environ.update(variables)
    capability = torch.backends.cpu.get_cpu_capability()
    if expected is not None and capability != expected:
        raise RuntimeError(f"--cpu-isa {choice}: ATen runs {capability} kernels; a kernel ran before the cap was set")
    return capability
