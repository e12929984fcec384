"""A torch_npu whose CANN is missing, as a process sees it: for the tools that must explain it in one line."""


def write_broken_cann_stand_in(directory) -> None:
    """Into `directory` (a pathlib.Path to put first on PYTHONPATH): a torch whose import fails as torch 2.5+ does
    when its autoloaded torch_npu cannot load CANN (torch's `_import_device_backends`: "Failed to load the backend
    extension: torch_npu", raised from the loader's OSError), and a torch_npu that imports it."""
    (directory / "torch").mkdir()
    (directory / "torch" / "__init__.py").write_text(
        "try:\n"
        "    raise OSError('libhccl.so: cannot open shared object file: No such file or directory')\n"
        "except OSError as err:\n"
        "    raise RuntimeError('Failed to load the backend extension: torch_npu. You can disable extension "
        "auto-loading with TORCH_DEVICE_BACKEND_AUTOLOAD=0.') from err\n")
    (directory / "torch_npu").mkdir()
    (directory / "torch_npu" / "__init__.py").write_text("import torch\n")
