"""Set-up's torch decision (deepspeed_npu/torch_install.py): an installed torch is kept, even a broken one, and on
an Ascend host no torch is installed (torch_npu's compatibility table at Ascend/pytorch 9e73e70 ends at torch 2.12)."""
import pytest

from deepspeed_npu.environment import NpuSetupError
from deepspeed_npu.torch_install import plan, release

BACKEND_FAILED = RuntimeError("Failed to load the backend extension: torch_npu. You can disable extension "
                              "auto-loading with TORCH_DEVICE_BACKEND_AUTOLOAD=0.")
BACKEND_FAILED.__cause__ = OSError("libhccl.so: cannot open shared object file: No such file or directory")


def test_versions_are_read_to_major_and_minor():
    assert [release(v) for v in ("2.6.0+cpu", "2.1.0.post8", "2.12.0rc1", "2.13.0")] == [(2, 6), (2, 1), (2, 12),
                                                                                          (2, 13)]


@pytest.mark.parametrize("host", ["cpu", "nvidia"])
def test_without_torch_a_cpu_or_nvidia_host_installs_one(host):
    assert plan(host, None, None, ModuleNotFoundError("No module named 'torch'")) == "install"


def test_an_ascend_host_without_torch_installs_none():
    with pytest.raises(NpuSetupError, match="set-up installs none on an Ascend host: install the torch release "
                                            "your torch_npu and CANN support"):
        plan("ascend", None, None, ModuleNotFoundError("No module named 'torch'"))


@pytest.mark.parametrize("host", ["ascend", "nvidia", "cpu"])
def test_an_installed_torch_that_fails_to_import_is_kept_and_explained(host):
    with pytest.raises(NpuSetupError, match=r"torch 2\.6\.0 is installed but fails to import, and set-up never "
                                            r"replaces an installed torch: torch_npu cannot load the CANN library "
                                            r"libhccl\.so"):
        plan(host, "2.6.0", "2.6.0.post1", BACKEND_FAILED)


def test_a_torch_that_does_not_fit_torch_npu_says_how_to_remove_a_shadowing_copy():
    with pytest.raises(NpuSetupError, match=r"torch 2\.13\.0 does not fit torch_npu 2\.6\.0\.post1, built for torch "
                                            r"2\.6: .* -m pip uninstall torch"):
        plan("ascend", "2.13.0", "2.6.0.post1", None)


def test_a_working_torch_is_reused_from_the_oldest_that_has_every_api():
    assert plan("ascend", "2.6.0", "2.6.0.post1", None) == "reuse"
    assert plan("cpu", "2.13.0+cpu", None, None) == "reuse"
    with pytest.raises(NpuSetupError, match=r"torch 2\.3\.1 is older than 2\.4, .* \(torch\.nn\.RMSNorm\)"):
        plan("nvidia", "2.3.1", None, None)
