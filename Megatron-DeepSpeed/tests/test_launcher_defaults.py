"""The launcher's default precision: bf16 on accelerators that have it, the user's choice otherwise."""
import pytest

from tools.launch_training import precision_flags


@pytest.mark.parametrize("device_name, bf16_supported, passthrough, expected", [
    ("cuda", True, [], ["--bf16"]),
    ("npu", True, ["--zero-stage", "1"], ["--bf16"]),
    ("cuda", False, [], []),  # Volta: fp32 unless --fp16 is asked for
    ("cuda", True, ["--fp16"], []),
    ("cuda", True, ["--bf16"], []),  # not twice
    ("cuda", True, ["--deepspeed_config", "ds.json"], []),  # the JSON's fp16 / bf16 sections decide
    ("cuda", True, ["--deepspeed_config=ds.json"], []),
    ("cpu", True, [], []),  # CPU runs stay fp32
])
def test_bf16_is_the_default_on_accelerators_that_support_it(device_name, bf16_supported, passthrough, expected):
    assert precision_flags(device_name, bf16_supported, passthrough) == expected
