"""The launcher's defaults: precision from the device's own answers (bf16, else fp16 with dynamic loss scaling where
an overflow shows as inf/NaN, else fp32) unless the user chose one, asked in a child so the launcher holds no device; one --distributed-timeout-minutes from which HCCL's timeouts follow; where the ranks meet
and which node reports."""
import os
import subprocess
import sys
from argparse import Namespace
from types import SimpleNamespace

import pytest
import torch
from deepspeed.accelerator import get_accelerator, set_accelerator
from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

from megatron import device
from megatron.errors import InputError
from megatron.device_probe import DeviceFacts, read_device_facts
from tests.helpers.broken_cann import write_broken_cann_stand_in
from tests.helpers.paths import PACKAGE_ROOT, REPO_ROOT, TOOLS
from tools.launch_training import (DEFAULT_TIMEOUT_MINUTES, check_memory, check_nodes, detect_device, precision_flags,
                                  rendezvous_flags, timeout_flags, wandb_flags)


def facts(name, bf16, fp16_overflow_visible=True):
    return DeviceFacts(name, 0 if name == "cpu" else 8, bf16, fp16_overflow_visible, None)


@pytest.mark.parametrize("device_name, bf16_supported, passthrough, expected", [
    ("cuda", True, [], ["--bf16"]),
    ("npu", True, ["--zero-stage", "1"], ["--bf16"]),
    ("npu", False, [], ["--fp16"]),  # no bf16, but an fp16 overflow shows as inf/NaN (INF_NAN mode)
    ("cuda", False, [], ["--fp16"]),  # Volta
    ("cuda", True, ["--fp16"], []),
    ("npu", False, ["--bf16"], []),  # not twice; the user's choice is theirs
    ("cuda", True, ["--deepspeed_config", "ds.json"], []),  # the JSON's fp16 / bf16 sections decide
    ("cuda", True, ["--deepspeed_config=ds.json"], []),
    ("cpu", True, [], []),  # CPU runs stay fp32
])
def test_precision_default(device_name, bf16_supported, passthrough, expected):
    assert precision_flags(facts(device_name, bf16_supported), passthrough)[0] == expected


def test_the_precision_line_says_which_and_why():
    assert precision_flags(facts("npu", False), [])[1] == ("precision: fp16 with dynamic loss scaling (this npu reports no "
                                                    "bf16 support)")
    assert precision_flags(facts("npu", True), [])[1] == "precision: bf16 (this npu reports bf16 support)"
    assert precision_flags(facts("cuda", True), ["--deepspeed_config=ds.json"])[1] == "precision: as --deepspeed_config says"


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

    def device_count(self):
        return 8

    def total_memory(self, device_index=None):
        return 32 << 30


def stand_in_torch_npu_utils(inf_nan_mode):
    """torch_npu.npu.utils as far as the trainer reads it: is_support_inf_nan() (torch_npu docs, (beta)
    torch_npu.npu.utils.is_support_inf_nan: True = INF_NAN mode, False = saturation mode)."""
    return SimpleNamespace(utils=SimpleNamespace(is_support_inf_nan=lambda: inf_nan_mode))


@pytest.fixture
def first_generation_npu(monkeypatch):
    previous = get_accelerator()
    set_accelerator(FirstGenerationNpu())
    monkeypatch.setattr(torch, "npu", stand_in_torch_npu_utils(inf_nan_mode=False), raising=False)
    yield
    set_accelerator(previous)


def test_a_device_without_bf16_or_visible_fp16_overflow_gets_fp32_though_deepspeed_lists_bf16(first_generation_npu):
    answers = read_device_facts()
    assert answers == DeviceFacts("npu", 8, False, False, 32 << 30)
    assert device.supports_dtype(torch.bfloat16) is False
    assert precision_flags(answers, []) == ([], "precision: fp32 (this npu reports no bf16 support, and its fp16 "
                                                "saturates on overflow instead of producing inf/NaN, which loss "
                                                "scaling needs to see); on NPUs below Ascend910B1 torch_npu's "
                                                "precision mode allow_fp32_to_fp16 still runs matmuls in fp16, "
                                                "where they saturate too")
    with pytest.raises(InputError, match=r"--bf16: this npu reports no bf16 support .*; leave it off to train in "
                                         r"fp32 \(--fp16 is refused too"):
        device.refuse_bf16_if_unsupported()  # what pretrain() says to a --bf16 given by hand
    with pytest.raises(InputError, match=r"--fp16: this npu saturates on fp16 overflow .* train in fp32"):
        device.refuse_fp16_if_overflow_invisible()  # and to a --fp16


def test_an_npu_in_inf_nan_mode_trains_fp16_where_it_lacks_bf16(first_generation_npu, monkeypatch):
    monkeypatch.setattr(torch, "npu", stand_in_torch_npu_utils(inf_nan_mode=True))
    assert precision_flags(read_device_facts(), [])[0] == ["--fp16"]
    device.refuse_fp16_if_overflow_invisible()


class UntouchableAccelerator(CPU_Accelerator):
    """Records every question put to it: in the launcher's process there must be none."""

    def __init__(self):
        super().__init__()
        self.asked = []

    def __getattribute__(self, name):
        if not name.startswith("_") and name != "asked":
            object.__getattribute__(self, "asked").append(name)
        return object.__getattribute__(self, name)


def test_the_launcher_asks_its_devices_in_a_child_and_holds_none(monkeypatch, capsys):
    """Any question to the device creates a device context (device 0) that would live as long as the launcher, i.e.
    the whole run; the child that answers instead uses the real accelerator of this machine (the CPU)."""
    previous = get_accelerator()
    untouchable = UntouchableAccelerator()
    set_accelerator(untouchable)
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    try:
        answers = detect_device("auto")
        precision_flags(answers, [])
        check_memory(validated_tiny_flags(), 200, answers.total_memory, skip=False)
    finally:
        set_accelerator(previous)
    assert answers == DeviceFacts("cpu", 0, False, True, None)
    assert untouchable.asked == []


def test_the_launchers_memory_estimate_follows_the_attention_kernel_the_device_child_reports(capsys):
    """The child reports whether the trainer's attention kernel there gets grouped K/V repeated (an adaptor's that
    takes them grouped, as the Ascend fusion attention does: no); the launcher's estimate counts accordingly."""
    from megatron.config.arguments import parse_args, validate_args
    from megatron.device_probe import CPU_FACTS
    from megatron.planning.command_line import with_kernel_answers

    on_npu = DeviceFacts("npu", 8, True, True, 64 << 30)
    grouped = SimpleNamespace(attention=SimpleNamespace(takes_grouped_kv=True))
    assert with_kernel_answers(on_npu, grouped).kv_repeated is False
    assert with_kernel_answers(on_npu, None).kv_repeated is True  # PyTorch's SDPA is handed them repeated
    assert with_kernel_answers(CPU_FACTS, grouped) == CPU_FACTS
    flags = validate_args(parse_args(["--num-layers", "32", "--hidden-size", "4096", "--num-attention-heads", "32",
                                      "--num-key-value-heads", "8", "--seq-length", "4096", "--micro-batch-size", "1",
                                      "--swiglu", "--bf16", "--tokenizer-type", "NullTokenizer", "--vocab-size",
                                      "32000", "--mock-data", "--lr", "1e-4", "--train-iters", "10"]), 8, "npu")
    estimates = []
    for kv_repeated in (True, False):
        check_memory(flags, 32000, None, skip=False, kv_repeated=kv_repeated)
        estimates.append(capsys.readouterr().out)
    assert estimates[0] != estimates[1]


def validated_tiny_flags():
    from megatron.config.arguments import parse_args, validate_args
    return validate_args(parse_args(["--model-size", "tiny", "--tokenizer-type", "NullTokenizer", "--vocab-size",
                                     "200", "--mock-data"]), 8, "cpu")


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


def test_a_broken_cann_is_diagnosed_in_one_line_before_the_launcher_imports_torch(tmp_path):
    write_broken_cann_stand_in(tmp_path)
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), PACKAGE_ROOT,
                                                                 os.path.join(REPO_ROOT, "DeepSpeed")])}
    environment.pop("DS_ACCELERATOR", None)
    done = subprocess.run([sys.executable, os.path.join(TOOLS, "launch_training.py"), "--run", "performance"],
                          env=environment, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert "torch_npu cannot load the CANN library libhccl.so" in done.stderr
    assert "source test/env_npu.sh" in done.stderr


@pytest.mark.parametrize("passthrough, expected", [
    (["--wandb-project", "gpt"], ["--wandb-save-dir", "/runs/r/wandb"]),
    (["--wandb-exp-name=first"], ["--wandb-save-dir", "/runs/r/wandb"]),
    (["--wandb-project", "gpt", "--wandb-save-dir", "/elsewhere"], []),
    (["--zero-stage", "1"], []),
])
def test_wandb_files_go_to_the_run_directory_unless_placed(passthrough, expected):
    assert wandb_flags(passthrough, "/runs/r") == expected


def test_a_run_ended_by_sigterm_without_the_exit_signal_handler_is_recorded_as_terminated_not_failed():
    from megatron.reports.job_output import FirstFailure
    from tools.launch_training import Job, how_it_ended

    parsed = SimpleNamespace(diverged_at=None, stopped_on_request=False)
    assert how_it_ended(Job(-15, FirstFailure(), terminated=True), parsed, succeeded=False) == (
        "terminated (SIGTERM; with --exit-signal-handler a run saves a checkpoint before it stops)")
    assert how_it_ended(Job(1, FirstFailure()), parsed, succeeded=False) == "failed: exit status 1"


@pytest.mark.full  # a real launcher, torchrun and one rank
def test_sigint_to_the_launcher_alone_stops_the_job_as_ctrl_c_does(tmp_path):
    """`kill -INT` of launch_training.py's pid (not its process group) was only noted and the run went on: the
    launcher passes it on to torchrun, which passes it to the rank; all end, and the launcher says so in one line."""
    import json
    import signal
    import time
    from tests.test_launcher_death import children_of, running, wait_until_ended

    run_dir = tmp_path / "run"
    launcher = subprocess.Popen([sys.executable, os.path.join(TOOLS, "launch_training.py"), "--run=performance",
                                 "--nproc=1", "--train_iters=100000", f"--output_dir={run_dir}", "--log-interval", "1",
                                 "--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "1"],
                                cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)  # no terminal's Ctrl-C reaches its group
    job = []
    try:
        log = run_dir / "train.log"
        while " iteration " not in (log.read_text() if log.exists() else ""):
            assert launcher.poll() is None, launcher.stderr.read()
            time.sleep(0.5)
        job = children_of(launcher.pid)
        job += [rank for torchrun in job for rank in children_of(torchrun)]
        assert len(job) == 2  # torchrun and its rank
        os.kill(launcher.pid, signal.SIGINT)
        _, stderr = launcher.communicate(timeout=120)  # before the fix: still training, 100000 iterations to go
        assert launcher.returncode == 130 and stderr.splitlines() == ["error: interrupted (Ctrl-C)"]
        assert wait_until_ended(job) == []
        assert json.loads((run_dir / "run.json").read_text())["ended"] == "interrupted (Ctrl-C)"
    finally:
        launcher.kill()  # torchrun and its rank end with it (launched_rank.end_with_parent)
        for pid in filter(running, job):
            os.kill(pid, signal.SIGKILL)
