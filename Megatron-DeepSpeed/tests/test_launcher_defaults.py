"""The launcher's defaults: precision from the device's own bf16 answer (bf16, else fp16 with dynamic loss scaling)
unless the user chose one; one --distributed-timeout-minutes from which HCCL's timeouts follow; where the ranks meet
and which node reports."""
from argparse import Namespace

import pytest
import torch
from deepspeed.accelerator import get_accelerator, set_accelerator
from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

from megatron import device
from megatron.errors import InputError
from tools.launch_training import (DEFAULT_TIMEOUT_MINUTES, check_nodes, device_bf16_supported, precision_flags,
                                  rendezvous_flags, timeout_flags)


@pytest.mark.parametrize("device_name, bf16_supported, passthrough, expected", [
    ("cuda", True, [], ["--bf16"]),
    ("npu", True, ["--zero-stage", "1"], ["--bf16"]),
    ("npu", False, [], ["--fp16"]),  # first-generation Ascend 910: no bf16
    ("cuda", False, [], ["--fp16"]),  # Volta
    ("cuda", True, ["--fp16"], []),
    ("npu", False, ["--bf16"], []),  # not twice; the user's choice is theirs
    ("cuda", True, ["--deepspeed_config", "ds.json"], []),  # the JSON's fp16 / bf16 sections decide
    ("cuda", True, ["--deepspeed_config=ds.json"], []),
    ("cpu", True, [], []),  # CPU runs stay fp32
])
def test_precision_default(device_name, bf16_supported, passthrough, expected):
    assert precision_flags(device_name, bf16_supported, passthrough)[0] == expected


def test_the_precision_line_says_which_and_why():
    assert precision_flags("npu", False, [])[1] == ("precision: fp16 with dynamic loss scaling (this npu reports no "
                                                    "bf16 support)")
    assert precision_flags("npu", True, [])[1] == "precision: bf16 (this npu reports bf16 support)"
    assert precision_flags("cuda", True, ["--deepspeed_config=ds.json"])[1] == "precision: as --deepspeed_config says"


class FirstGenerationNpu(CPU_Accelerator):
    """DeepSpeed's NPU accelerator as it answers on an Ascend910A (deepspeed/accelerator/npu_accelerator.py, 0.19.8):
    supported_dtypes() always lists bf16, while is_bf16_supported() passes on torch_npu's answer, False below
    Ascend910B1 (torch_npu/csrc/core/npu/NpuVariables.cpp, IsBF16Supported)."""

    def device_name(self, device_index=None):
        return "npu"

    def is_bf16_supported(self):
        return False

    def supported_dtypes(self):
        return [torch.float, torch.half, torch.bfloat16]


@pytest.fixture
def first_generation_npu():
    previous = get_accelerator()
    set_accelerator(FirstGenerationNpu())
    yield
    set_accelerator(previous)


def test_a_device_without_bf16_gets_fp16_though_deepspeed_lists_bf16(first_generation_npu):
    assert device_bf16_supported() is False
    assert device.supports_dtype(torch.bfloat16) is False
    assert precision_flags("npu", device_bf16_supported(), [])[0] == ["--fp16"]
    with pytest.raises(InputError, match=r"--bf16: this npu reports no bf16 support .* use --fp16"):
        device.refuse_bf16_if_unsupported()  # what pretrain() says to a --bf16 given by hand


@pytest.mark.parametrize("passthrough, expected", [
    ([], (["--distributed-timeout-minutes", f"{DEFAULT_TIMEOUT_MINUTES:g}"], DEFAULT_TIMEOUT_MINUTES)),
    (["--distributed-timeout-minutes", "90"], ([], 90.0)),
    (["--distributed-timeout-minutes=5"], ([], 5.0)),
])
def test_one_timeout_flag(passthrough, expected):
    assert timeout_flags(passthrough) == expected


def test_a_timeout_that_is_not_a_number_is_one_line():
    with pytest.raises(InputError, match="--distributed-timeout-minutes 'soon' is not a number"):
        timeout_flags(["--distributed-timeout-minutes", "soon"])


def nodes(**given):
    return Namespace(**{"nnodes": 1, "node_rank": 0, "master_addr": "127.0.0.1", "master_port": None,
                        "output_dir": None, **given})


def test_one_node_without_a_port_lets_torchrun_pick_one_and_several_nodes_meet_at_29500():
    assert rendezvous_flags(nodes()) == ["--standalone", "--nnodes=1"]
    assert "--master_port=1234" in rendezvous_flags(nodes(master_port=1234))
    assert rendezvous_flags(nodes(nnodes=2, node_rank=1, master_addr="10.0.0.1")) == [
        "--nnodes=2", "--node_rank=1", "--master_addr=10.0.0.1", "--master_port=29500"]


def test_the_last_node_reports_and_multi_node_flags_are_checked():
    assert check_nodes(nodes(nnodes=4, node_rank=2, output_dir="run")) == 3
    with pytest.raises(InputError, match="--node_rank=2 must be between 0 and --nnodes - 1 = 1"):
        check_nodes(nodes(nnodes=2, node_rank=2, output_dir="run"))
    with pytest.raises(InputError, match="give --output_dir=DIR on a file system all nodes see"):
        check_nodes(nodes(nnodes=2))
