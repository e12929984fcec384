"""tests/helpers/cpu_isa.py: --cpu-isa avx2 caps the kernels of the test process and of every process it starts."""
import subprocess
import sys

from tests.helpers.paths import PACKAGE_ROOT

CHILD = "import torch; print(torch.backends.cpu.get_cpu_capability())"
PARENT = ("import subprocess, sys; from tests.helpers import cpu_isa; print(cpu_isa.force('avx2')); "
          f"print(subprocess.run([sys.executable, '-c', {CHILD!r}], capture_output=True, text=True).stdout.strip())")


def test_the_avx2_cap_holds_in_the_process_and_its_children():
    done = subprocess.run([sys.executable, "-c", PARENT], capture_output=True, text=True, cwd=PACKAGE_ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["AVX2", "AVX2"]

