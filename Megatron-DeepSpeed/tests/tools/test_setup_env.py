"""tools/setup_env.sh on an Ascend host whose torch fails to import because CANN is missing: it stops with the
plain-words reason and installs nothing (a torch installed into .venv would shadow the one torch_npu was built for)."""
import os
import subprocess
import sys

from tests.helpers.broken_cann import write_broken_cann_stand_in
from tests.helpers.paths import TOOLS


def test_a_broken_torch_on_an_ascend_host_is_explained_and_never_replaced(tmp_path):
    stand_in, bin_dir, venv = tmp_path / "site", tmp_path / "bin", tmp_path / "venv"
    for directory in (stand_in, bin_dir, venv / "bin"):
        directory.mkdir(parents=True)
    write_broken_cann_stand_in(stand_in)
    (bin_dir / "npu-smi").write_text("#!/bin/sh\n")
    (venv / "bin" / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')  # the project's environment
    for script in (bin_dir / "npu-smi", venv / "bin" / "python"):
        script.chmod(0o755)
    environment = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "HOME": str(tmp_path),
                   "ASCEND_ROOT": str(tmp_path / "no-cann"), "MEGATRON_VENV": str(venv), "PYTHONPATH": str(stand_in),
                   "PIP_NO_INDEX": "1"}  # an install attempt fails at once instead of reaching for the network
    done = subprocess.run(["bash", os.path.join(TOOLS, "setup_env.sh")], capture_output=True, text=True,
                          timeout=120, env=environment)
    assert done.returncode != 0
    assert "installing" not in done.stderr and "pip install" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: torch 2.13.0") and (" is installed but fails to import, and set-up never replaces "
                                                      "an installed torch: torch_npu cannot load the CANN library "
                                                      "libhccl.so") in last
