"""deepspeed_npu on a CPU host: which accelerator and kernels it selects, and what it says when it cannot.

No NPU is reachable here, so torch_npu is replaced by a stand-in module placed in sys.modules for one
test at a time; its fusion attention has the operator's schema and documented semantics
(npu_fusion_attention_stand_in.py: BNSD layout, True = masked, sparse_mode 2 = top-left causal read from a
2048 x 2048 compressed mask).
"""
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from npu_fusion_attention_stand_in import NpuFusionAttentionStandIn

from deepspeed_npu import NpuSetupError, activate, explain_import_failure
from deepspeed_npu.__main__ import main as diagnose
from deepspeed_npu.fused_kernels import FusionAttention
from megatron.errors import InputError
from megatron.model.attention_spec import AttentionSpec
from megatron.model.kernels import PORTABLE_KERNELS, sdpa_attention, select_kernels

REPO = Path(__file__).resolve().parents[2]
ACCELERATOR_SELECTOR = "deepspeed.accelerator.real_accelerator"  # DeepSpeed's module that caches its choice
LIBHCCL_MISSING = "libhccl.so: cannot open shared object file: No such file or directory"


class StandInFusedAdamW(torch.optim.AdamW):
    """Stands for torch_npu.optim.NpuFusedAdamW, which the trainer must never be given."""


def stand_in_torch_npu(device_count=8, chip_name="Ascend910B3", with_fusion_attention=True):
    module = types.ModuleType("torch_npu")
    module.npu = types.SimpleNamespace(is_available=lambda: device_count > 0, device_count=lambda: device_count,
                                       get_device_name=lambda index=0: chip_name,
                                       current_device=lambda: 0)
    module.optim = types.SimpleNamespace(NpuFusedAdamW=StandInFusedAdamW)
    if with_fusion_attention:
        module.npu_fusion_attention = NpuFusionAttentionStandIn()
    return module


@pytest.fixture(autouse=True)
def plain_host(monkeypatch):
    """Like a fresh process on a host without Ascend variables: DeepSpeed has not chosen an accelerator yet
    (other test files may have made it choose), and activate()'s writes to DS_ACCELERATOR are undone."""
    for name in ("DS_ACCELERATOR", "ASCEND_RT_VISIBLE_DEVICES", "ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH"):
        monkeypatch.setenv(name, "")  # records the original value, so the deletion below is undone too
        monkeypatch.delenv(name)
    monkeypatch.delitem(sys.modules, ACCELERATOR_SELECTOR, raising=False)


@pytest.fixture
def install(monkeypatch):
    """Make `import torch_npu` find the given stand-in (None: behave as if torch_npu were not installed)."""
    def put(module):
        monkeypatch.setitem(sys.modules, "torch_npu", module)
        return module
    return put


@pytest.fixture
def broken_torch_npu(monkeypatch, tmp_path):
    """A torch_npu package on sys.path whose import fails like it does on a host without CANN."""
    package = tmp_path / "torch_npu"
    package.mkdir()
    (package / "__init__.py").write_text(f"raise ImportError({LIBHCCL_MISSING!r})\n")
    monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))


# ---- selection: what activate() does on each kind of host ----

def test_without_torch_npu_nothing_changes(install):
    install(None)
    result = activate()
    assert not result.active and result.kernels is None
    assert result.summary == "NPU support inactive: torch_npu is not installed"
    assert "DS_ACCELERATOR" not in os.environ
    assert select_kernels("npu", result.kernels) == PORTABLE_KERNELS


def test_asking_for_npu_without_torch_npu_says_what_to_install(install, monkeypatch):
    install(None)
    monkeypatch.setenv("DS_ACCELERATOR", "npu")
    with pytest.raises(NpuSetupError, match=r"DS_ACCELERATOR=npu .* torch_npu is not installed: install"):
        activate()


def test_another_requested_accelerator_is_respected_without_touching_torch_npu(broken_torch_npu, monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    result = activate()  # importing the broken torch_npu would raise
    assert not result.active
    assert "DS_ACCELERATOR=cpu" in result.summary
    assert os.environ["DS_ACCELERATOR"] == "cpu"


def test_libhccl_import_error_names_cann_and_the_fix(broken_torch_npu):
    with pytest.raises(NpuSetupError) as raised:
        activate()
    message = str(raised.value)
    assert "libhccl.so" in message and "CANN" in message
    assert "source /usr/local/Ascend/ascend-toolkit/set_env.sh" in message
    assert isinstance(raised.value, InputError)  # the entry script's run_cli prints it as one line
    assert "DS_ACCELERATOR" not in os.environ


def test_no_visible_device_is_explained(install, monkeypatch):
    install(stand_in_torch_npu(device_count=0))
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "9")
    with pytest.raises(NpuSetupError) as raised:
        activate()
    message = str(raised.value)
    assert "sees no NPU" in message and "npu-smi info" in message
    assert "ASCEND_RT_VISIBLE_DEVICES='9'" in message
    assert "set_env.sh" in message  # ASCEND_TOOLKIT_HOME is unset: CANN's environment was not loaded
    assert "DS_ACCELERATOR" not in os.environ


def test_failing_device_query_is_reported_with_its_cause(install):
    module = install(stand_in_torch_npu())

    def driver_failure():
        raise RuntimeError("drvGetDevNum failed")
    module.npu.is_available = driver_failure
    with pytest.raises(NpuSetupError, match="sees no NPU.*drvGetDevNum failed"):
        activate()


def test_working_npu_selects_deepspeed_npu_and_offers_fused_attention_for_training(install):
    module = install(stand_in_torch_npu(device_count=8, chip_name="Ascend910B3"))
    result = activate()
    assert result.active
    assert result.summary == ("NPU support active: 8 NPUs, DeepSpeed accelerator npu (hccl backend); kernels "
                              "chosen for the chip once each rank has bound its NPU")
    assert result.kernels.description() == "torch_npu fused attention for training, PyTorch SDPA for inference"
    assert os.environ["DS_ACCELERATOR"] == "npu"
    npu = select_kernels("npu", result.kernels)  # what the trainer builds the model and optimizer with
    assert isinstance(npu.attention, FusionAttention)
    assert npu.adam is select_kernels("npu").adam and npu.adam.func is torch.optim.AdamW  # not NpuFusedAdamW
    assert npu.layer_norm is torch.nn.LayerNorm
    assert npu.description() == "attention torch_npu.npu_fusion_attention, AdamW(foreach=True)"
    query = torch.randn(1, 2, 4, 16)
    npu.attention(query, query, query, AttentionSpec())
    assert len(module.npu_fusion_attention.calls) == 1  # the offered kernel calls torch_npu's
    assert select_kernels("npu", result.kernels, training=False).attention is sdpa_attention


@pytest.mark.parametrize("chip_name", ["Ascend910B1", "Ascend910B2C", "Ascend910B4-1"])
def test_atlas_a2_training_chips_get_fused_attention(install, chip_name):
    install(stand_in_torch_npu(chip_name=chip_name))
    assert isinstance(select_kernels("npu", activate().kernels).attention, FusionAttention)


# First-generation Ascend 910 (names torch_npu knows below Ascend910B1), inference chips, Atlas A3 (not in the
# operator's list of products), and a device that did not say its name.
@pytest.mark.parametrize("chip_name", ["Ascend910A", "Ascend910ProB", "Ascend910PremiumA", "Ascend910B",
                                       "Ascend310P3", "Ascend910_9391", ""])
def test_chips_outside_the_documented_list_keep_portable_attention_and_say_why(install, chip_name):
    install(stand_in_torch_npu(chip_name=chip_name))
    result = activate()
    assert select_kernels("npu", result.kernels).attention is sdpa_attention
    assert result.kernels.description() == ("PyTorch SDPA attention (torch_npu documents npu_fusion_attention for "
                                   f"Atlas A2 training chips (Ascend910B1-B4), not for {chip_name!r})")


def test_torch_npu_without_fusion_attention_keeps_portable_attention(install):
    install(stand_in_torch_npu(with_fusion_attention=False))
    result = activate()
    assert result.active
    assert select_kernels("npu", result.kernels).attention is sdpa_attention
    assert result.kernels.description() == "PyTorch SDPA attention (this torch_npu has no npu_fusion_attention)"


def test_deepspeed_that_already_chose_another_accelerator_is_reported(install, monkeypatch):
    monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
    import deepspeed.accelerator
    selector = deepspeed.accelerator.real_accelerator  # the module plain_host hid, if it was imported before
    monkeypatch.setitem(sys.modules, ACCELERATOR_SELECTOR, selector)
    chosen = selector.get_accelerator().device_name()  # what DeepSpeed picks on this host without torch_npu
    install(stand_in_torch_npu())
    with pytest.raises(NpuSetupError, match=rf"DeepSpeed already chose its '{chosen}' accelerator .* before "
                                            r"the first `import deepspeed`"):
        activate()
    assert "DS_ACCELERATOR" not in os.environ


# ---- explanations of failed imports ----

def raised_from(cause, wrapper=None):
    """An exception as torch raises it: the wrapper, with `cause` as its __cause__."""
    try:
        try:
            raise cause
        except Exception as inner:
            if wrapper is None:
                raise
            raise wrapper from inner
    except Exception as outer:
        return outer


@pytest.mark.parametrize("error, expected", [
    # `import torch` with torch_npu installed but CANN missing: torch wraps the loader's error.
    (raised_from(ImportError("libascendcl.so: cannot open shared object file: No such file or directory"),
                 RuntimeError("Failed to load the backend extension: torch_npu. You can disable extension "
                              "auto-loading with TORCH_DEVICE_BACKEND_AUTOLOAD=0.")),
     ["CANN library libascendcl.so", "source /usr/local/Ascend/ascend-toolkit/set_env.sh", "pip uninstall"]),
    (raised_from(OSError("libascend_hal.so: cannot open shared object file: No such file or directory")),
     ["Ascend driver library libascend_hal.so", "npu-smi info", "LD_LIBRARY_PATH"]),
    (raised_from(ImportError("/site-packages/torch_npu/lib/libtorch_npu.so: undefined symbol: _ZN3c104impl")),
     ["does not fit the installed torch", "release built for torch"]),
    (raised_from(ModuleNotFoundError("No module named 'yaml'", name="yaml")),
     ["needs the Python module 'yaml'", "install it with pip"]),
    (raised_from(RuntimeError("something unforeseen")),
     ["fails to import (RuntimeError: something unforeseen)", "set_env.sh"]),
])
def test_import_failures_are_explained_in_plain_words(error, expected):
    message = explain_import_failure(error)
    for phrase in expected:
        assert phrase in message


# ---- `python -m deepspeed_npu` and the import promise ----

def test_diagnosis_command_reports_each_state(install, capsys):
    install(None)
    assert diagnose() == 0
    assert capsys.readouterr().out == "NPU support inactive: torch_npu is not installed\n"
    install(stand_in_torch_npu(device_count=0))
    assert diagnose() == 1
    assert capsys.readouterr().err.startswith("error: torch_npu")
    install(stand_in_torch_npu(device_count=8, chip_name="Ascend910B3"))
    assert diagnose() == 0
    assert capsys.readouterr().out == "NPUs ready: 8 x Ascend910B3\n"
    assert "DS_ACCELERATOR" not in os.environ  # the diagnosis only looks


def test_importing_the_package_imports_no_torch():
    """A broken torch_npu breaks `import torch`, so the package must load without it to explain that."""
    path = os.pathsep.join([str(REPO / "DeepSpeed"), str(REPO / "Megatron-DeepSpeed")])
    probe = "import sys, deepspeed_npu; print(sorted(m for m in ('torch', 'torch_npu') if m in sys.modules))"
    output = subprocess.run([sys.executable, "-c", probe], env={**os.environ, "PYTHONPATH": path},
                            capture_output=True, text=True, check=True).stdout
    assert output.strip() == "[]"


# ---- test/env_npu.sh ----

def source_env_script(environment, show):
    """`source test/env_npu.sh` under `set -euo pipefail` in `environment`; the variables of `show`, '|'-joined."""
    values = "|".join(f"${{{name}:-}}" for name in show)
    script = f'set -euo pipefail; source {REPO / "test" / "env_npu.sh"}; echo "{values}"'
    return subprocess.run(["bash", "-c", script], env={"PATH": os.environ["PATH"], **environment},
                          capture_output=True, text=True, check=True).stdout.strip().split("|")


def fake_cann(root, product="ascend-toolkit", home_variable="ASCEND_TOOLKIT_HOME"):
    """A CANN install under `root` whose set_env.sh, like CANN's own, reads a variable that may be unset."""
    toolkit = root / product
    toolkit.mkdir(parents=True)
    (toolkit / "set_env.sh").write_text(f"export {home_variable}={toolkit}/latest\n"
                                        f"export LD_LIBRARY_PATH=${home_variable}/lib64:$LD_LIBRARY_PATH\n")
    return toolkit


def test_env_script_loads_cann_and_keeps_user_settings(tmp_path):
    toolkit = fake_cann(tmp_path)
    (tmp_path / "driver" / "lib64").mkdir(parents=True)
    cann_home, library_path, python_path, queue, exec_timeout = source_env_script(
        {"HOME": str(tmp_path), "ASCEND_ROOT": str(tmp_path), "TASK_QUEUE_ENABLE": "1"},
        ["ASCEND_TOOLKIT_HOME", "LD_LIBRARY_PATH", "PYTHONPATH", "TASK_QUEUE_ENABLE", "HCCL_EXEC_TIMEOUT"])
    assert cann_home == f"{toolkit}/latest"
    assert library_path.split(":")[:2] == [str(tmp_path / "driver" / "lib64"), f"{toolkit}/latest/lib64"]
    assert python_path.split(":") == [str(REPO / "DeepSpeed"), str(REPO / "Megatron-DeepSpeed")]
    assert queue == "1"
    assert exec_timeout == ""  # HCCL's timeouts follow --distributed-timeout-minutes (megatron.parallel_state)


def test_env_script_runs_cann_without_the_callers_options_and_restores_them(tmp_path):
    """CANN's script may read unset variables and run failing commands; under the caller's `set -euo pipefail` that
    would end the caller silently. Inside, the options are off; after, the caller has them back."""
    toolkit = tmp_path / "ascend-toolkit"
    toolkit.mkdir()
    (toolkit / "set_env.sh").write_text(f"false | true; grep -q nothing /nonexistent; echo $UNSET_IN_CANN >/dev/null\n"
                                        f"export ASCEND_HOME_PATH={toolkit}/latest\n")
    home, options = source_env_script({"HOME": str(tmp_path), "ASCEND_ROOT": str(tmp_path)},
                                      ["ASCEND_HOME_PATH", "-"])
    assert home == f"{toolkit}/latest"
    assert {"e", "u"} <= set(options)
    pipefail = subprocess.run(["bash", "-c", f'set -euo pipefail; source {REPO / "test" / "env_npu.sh"}; '
                               'shopt -qo pipefail && echo on'], capture_output=True, text=True,
                              env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), "ASCEND_ROOT": str(tmp_path)})
    assert pipefail.stdout.strip() == "on"


def test_a_failing_cann_script_is_one_line_and_stops_the_caller(tmp_path):
    toolkit = tmp_path / "ascend-toolkit"
    toolkit.mkdir()
    (toolkit / "set_env.sh").write_text("return 3\n")
    result = subprocess.run(["bash", "-c", f'set -euo pipefail; source {REPO / "test" / "env_npu.sh"}; echo went on'],
                            capture_output=True, text=True,
                            env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), "ASCEND_ROOT": str(tmp_path)})
    assert result.returncode != 0 and "went on" not in result.stdout
    assert result.stderr.strip().splitlines() == [
        f"env_npu.sh: CANN's {toolkit}/set_env.sh failed (exit status 3); run 'source {toolkit}/set_env.sh' by hand "
        "to see why, or set ASCEND_ROOT to a working CANN installation"]


def test_env_script_finds_nnae(tmp_path):
    nnae = fake_cann(tmp_path, "nnae", home_variable="ASCEND_HOME_PATH")
    [home] = source_env_script({"HOME": str(tmp_path), "ASCEND_ROOT": str(tmp_path)}, ["ASCEND_HOME_PATH"])
    assert home == f"{nnae}/latest"


@pytest.mark.parametrize("loaded", ["ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH"])
def test_env_script_does_not_load_cann_twice(tmp_path, loaded):
    fake_cann(tmp_path)
    [library_path] = source_env_script({"HOME": str(tmp_path), "ASCEND_ROOT": str(tmp_path), loaded: "/opt/cann",
                                        "LD_LIBRARY_PATH": "/opt/cann/lib64"}, ["LD_LIBRARY_PATH"])
    assert library_path == "/opt/cann/lib64"


def test_env_script_run_instead_of_sourced_says_how_to_use_it():
    result = subprocess.run(["bash", str(REPO / "test" / "env_npu.sh")], capture_output=True, text=True)
    assert result.returncode == 2
    assert "run 'source" in result.stderr


def test_activation_names_no_chip_until_the_kernels_are_asked_for(install):
    """Naming the chip initialises torch_npu's runtime on the current device: at activation that is device 0 in
    every rank of a node, so the name waits until the trainer, its NPU bound, asks for the kernels."""
    module = install(stand_in_torch_npu(chip_name="Ascend910B3"))
    asked = []
    module.npu.get_device_name = lambda index=0: asked.append(index) or "Ascend910B3"
    result = activate()
    assert asked == []
    assert isinstance(select_kernels("npu", result.kernels).attention, FusionAttention)
    assert asked == [0]  # the current device, which the rank has bound by then


def test_env_script_finds_the_newest_versioned_cann(tmp_path):
    """A CANN installed in a versioned directory only (cann-<version>/set_env.sh, no ascend-toolkit/ link)."""
    fake_cann(tmp_path, "cann-8.2.RC1", home_variable="ASCEND_HOME_PATH")
    newest = fake_cann(tmp_path, "cann-8.10.0", home_variable="ASCEND_HOME_PATH")
    [home] = source_env_script({"HOME": str(tmp_path), "ASCEND_ROOT": str(tmp_path)}, ["ASCEND_HOME_PATH"])
    assert home == f"{newest}/latest"
