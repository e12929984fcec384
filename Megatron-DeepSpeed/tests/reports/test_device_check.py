"""tools/device_check.sh: the accelerator report, run for real in its reduced CPU mode, and its one-line refusal
on an Ascend host whose torch_npu is missing; the attention-kernel probe it reports."""
import json
import os
import re
import subprocess

import pytest
import torch

from megatron.errors import InputError
from megatron.model.kernels import sdpa_attention
from megatron.reports.device_check import (CPU_SHAPES, Layout, SpeedRow, TrainingFailed, attention_kernel,
                                           check_layouts, correctness_training, half_precisions, node_layouts, report, speed_grid, speed_row, speed_table,
                                           train_in_fresh_process)
from megatron.training.log_lines import iteration_line, memory_line
from tests.helpers.paths import TOOLS

SCRIPT = os.path.join(TOOLS, "device_check.sh")


def test_attention_kernel_names_the_sdpa_kernel_that_runs():
    # The causal path passes no mask, so PyTorch may pick its flash kernel: on CPU, the CPU flash kernel.
    assert attention_kernel(sdpa_attention, heads=4, seq=64, head_dim=16) == (
        "aten::_scaled_dot_product_flash_attention_for_cpu")
    assert attention_kernel(lambda q, k, v, spec: q @ k.transpose(-1, -2) @ v, 4, 64, 16) == (
        "not an SDPA kernel")


@pytest.mark.full  # whole training runs
def test_cpu_report_checks_precision_and_recompute(tmp_path):
    """The correctness checks alone: the speed grid's cells are the device run's, below."""
    report = tmp_path / "report.md"
    done = subprocess.run(["bash", SCRIPT, "--cpu", "--only", "correctness", "--iterations", "3", "--output",
                           str(report), "--report-dir", str(tmp_path / "run")], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    text = report.read_text()
    assert sorted(os.listdir(tmp_path / "run")) == ["logs.txt", "report.md", "speed.json"]
    assert (tmp_path / "run" / "report.md").read_text() == text
    assert json.loads((tmp_path / "run" / "speed.json").read_text()) == []
    assert "device: cpu (cpu), 1 used" in text
    recompute = float(re.search(r"recompute vs none, fp32: max relative loss gap (\S+)", text).group(1))
    assert recompute < 1e-6  # recomputation repeats the same arithmetic
    bf16 = float(re.search(r"bf16 vs fp32 over 3 iterations: max relative loss gap ([^;\s]+)", text).group(1))
    assert 0 < bf16 < 1e-2
    assert "| toy |" not in text


@pytest.mark.full  # whole training runs
def test_the_device_run_is_one_command_with_one_report_directory(tmp_path):
    """tools/device_run.sh in its CPU mode: the speed grid alone (every CPU shape), its report, rows and logs in one
    new directory."""
    run = os.path.join(os.path.dirname(SCRIPT), "device_run.sh")
    done = subprocess.run(["bash", run, str(tmp_path / "run"), "--cpu", "--iterations", "2"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = (tmp_path / "run" / "report.md").read_text()
    assert "recompute vs none" not in report
    assert "[toy] attention kernel, causal bf16: aten::_scaled_dot_product_flash_attention_for_cpu" in report
    rows = json.loads((tmp_path / "run" / "speed.json").read_text())
    assert [row["shape"] for row in rows] == ["toy", "toy", "toy-MoE4"] and all(row["samples_per_second"] > 0
                                                                                for row in rows)
    assert (tmp_path / "run" / "logs.txt").read_text().count("$ pretrain_gpt.py ") == 3
    toy = [line for line in report.splitlines() if line.startswith("| toy |")]
    assert len(toy) == 2 and "**best**" in toy[0] and toy[0].count("n/a") == 1  # MFU: no CPU peak
    moe = [line.split(" | ") for line in report.splitlines() if line.startswith("| toy-MoE4 |")]
    assert len(moe) == 1 and moe[0][1] == "mbs 2, no recompute, ZeRO 1 **best**" and float(moe[0][2]) > 0


def test_an_existing_report_directory_is_refused_before_any_work(tmp_path):
    from tools.device_check import main

    (tmp_path / "run").mkdir()
    with pytest.raises(InputError, match="--report-dir .* already exists; choose another directory"):
        main(["--cpu", "--report-dir", str(tmp_path / "run")])
    assert os.listdir(tmp_path / "run") == []


@pytest.mark.full
def test_npu_requested_without_torch_npu_is_one_line():
    done = subprocess.run(["bash", SCRIPT], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "DS_ACCELERATOR": "npu"})
    assert done.returncode == 2
    assert done.stderr.strip().startswith("error: DS_ACCELERATOR=npu asks for the NPUs, but torch_npu is not installed")
    assert "Traceback" not in done.stderr


def test_on_an_ascend_host_the_check_loads_cann_as_the_entry_scripts_do(tmp_path):
    """A fresh shell on an Ascend host (npu-smi on PATH, CANN installed but not loaded): the check's python runs
    with CANN's environment, from env_npu.sh, instead of failing to import torch."""
    bin_dir, cann = tmp_path / "bin", tmp_path / "ascend" / "ascend-toolkit"
    bin_dir.mkdir()
    cann.mkdir(parents=True)
    (bin_dir / "npu-smi").write_text("#!/bin/sh\n")
    (cann / "set_env.sh").write_text(f"export ASCEND_HOME_PATH={cann}/latest\n")
    python = bin_dir / "python"  # answers the script's import probe, then shows what the check would see
    python.write_text('#!/bin/sh\n[ "$1" = -c ] && exit 0\necho "CANN: $ASCEND_HOME_PATH, queue: $TASK_QUEUE_ENABLE"\n')
    for script in (bin_dir / "npu-smi", python):
        script.chmod(0o755)
    environment = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "HOME": str(tmp_path),
                   "ASCEND_ROOT": str(tmp_path / "ascend"), "PYTHON": str(python)}
    done = subprocess.run(["bash", SCRIPT], capture_output=True, text=True, timeout=60, env=environment)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"CANN: {cann}/latest, queue: 2"


def fake_log(samples_per_second, peak_mib):
    lines = [iteration_line(i, 4, 2 * i, 100.0, 1e-4, 2, 5.0, 1.0, 1.0, 0, 0, samples_per_second, 1.0, 0.25)
             for i in range(1, 5)]
    stats = {"allocated_bytes": 0, "peak_allocated_bytes": peak_mib * 2 ** 20, "reserved_bytes": 0,
             "peak_reserved_bytes": 0}
    return "\n".join(lines + [memory_line(0, 4, stats)])


def test_speed_cells_average_after_warm_up_and_failed_cells_say_why():
    shape = ("toy", 2, 64, 4, 64)

    def out_of_memory(argv):
        raise TrainingFailed("out of device memory")

    finished = speed_row(shape, "mbs 2", ["--micro-batch-size", "2"], 4, lambda argv: fake_log(10.0, 512))
    planned = finished.planned_memory_gib
    assert finished == SpeedRow("toy", "mbs 2", 10.0, 640.0, 1.0, 0.25, 0.5, planned)
    failed = speed_row(shape, "mbs 64", ["--micro-batch-size", "64"], 4, out_of_memory)
    assert failed.failure == "out of device memory"
    table = speed_table([failed, finished])
    failed_planned = failed.planned_memory_gib
    assert f"| toy | mbs 64: failed, out of device memory | - | - | - | - | - | {failed_planned:.2f} |" in table
    # the best row is a finished one; the planner's error is against the measured peak
    assert f"| toy | mbs 2 **best** | 10.00 | 640 | 1 | 25.0% | 0.50 | {planned:.2f} ({(planned - 0.5) / 0.5:+.1%}) |" \
        in table
    assert f"| 0.50 | {planned:.2f} |" in speed_table([finished], allocator_peaks=False)  # a CPU's peak is its RSS


def test_each_speed_cell_carries_the_planners_estimate_for_its_flags():
    """Micro-batch 2 and 64 of the toy shape: the activations grow with it, the weights do not."""
    shape = ("toy", 2, 64, 4, 64)
    small, large = (speed_row(shape, f"mbs {micro}", ["--micro-batch-size", str(micro)], 4,
                              lambda argv: fake_log(10.0, 512)).planned_memory_gib for micro in (2, 64))
    assert 0 < small < large


@pytest.mark.full  # starts a training process
def test_a_failing_training_process_is_reported_by_its_error_line():
    with pytest.raises(TrainingFailed, match="--hidden-size"):
        train_in_fresh_process(["--num-layers", "2", "--hidden-size", "30", "--num-attention-heads", "4",
                                "--seq-length", "16", "--mock-data", "--tokenizer-type", "NullTokenizer",
                                "--vocab-size", "100", "--micro-batch-size", "2", "--train-iters", "1", "--lr", "1e-3"])


def test_unknown_shapes_are_refused_before_any_work():
    said = []
    with pytest.raises(InputError, match="--shapes toy,345M: 345M unknown here; choose from toy, toy-MoE4"):
        report(False, pretrain=None, iterations=1, say=said.append, shapes=["toy", "345M"])
    assert said == []


@pytest.mark.full  # starts the script
def test_an_existing_report_file_is_refused_untouched(tmp_path):
    report_file = tmp_path / "report.md"
    report_file.write_text("the user's report")
    done = subprocess.run(["bash", SCRIPT, "--cpu", "--output", str(report_file)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip() == (f"error: --output {report_file} already exists; choose another file, or remove "
                                   "it first")
    assert report_file.read_text() == "the user's report"


def test_a_node_checks_the_layouts_its_devices_allow():
    assert [layout.name for layout in node_layouts(8)] == ["DP2", "TP2", "PP2", "TP2xPP2xDP2"]
    assert [layout.name for layout in node_layouts(2)] == ["DP2", "TP2", "PP2"]
    assert node_layouts(1) == [] and Layout(1, 1, 1).name == "one device"


@pytest.mark.full  # four training jobs, three of them over two processes
def test_each_layout_on_several_processes_trains_as_one_device():
    said = []
    check_layouts(CPU_SHAPES[0], 2, False, 2, said.append)
    assert [line.split(" vs one")[0] for line in said] == [
        "[toy] DP2 on 2 devices", "[toy] TP2 on 2 devices", "[toy] PP2 on 2 devices"]
    gaps = [float(line.rsplit(" ", 1)[1]) for line in said]
    assert max(gaps) < 1e-5, said


def flag_value(flags, name):
    return flags[len(flags) - 1 - flags[::-1].index(name) + 1]  # the last one given, as argparse takes it


def test_accelerator_speed_cells_accumulate_half_a_million_tokens_and_log_every_ten_iterations():
    for label, flags in speed_grid("345M", on_accelerator=True, seq=1024):
        assert flag_value(flags, "--global-batch-size") == "512", label
        assert flag_value(flags, "--log-interval") == "10"
        assert "--bf16" in flags
    assert {flag_value(flags, "--log-interval") for _, flags in speed_grid("1.3B", True, 1024, log_interval=3)} == {
        "3"}
    for shape in ("345M", "1.3B"):  # the same cell eager and compiled: the run settles --torch-compile's default
        labels = [label for label, _ in speed_grid(shape, True, 1024)]
        compiled = [label for label in labels if label.endswith(", torch.compile")]
        assert compiled and all(label.removesuffix(", torch.compile") in labels for label in compiled)
    micro_batches = [int(flag_value(flags, "--micro-batch-size")) for _, flags in speed_grid("345M", True, 1024)]
    assert max(micro_batches) == 32
    [(_, cpu_flags)] = speed_grid("toy", on_accelerator=False, seq=64)[:1]
    assert flag_value(cpu_flags, "--global-batch-size") == "2" and flag_value(cpu_flags, "--log-interval") == "1"


def test_without_an_inductor_backend_the_compiled_cells_are_left_out():
    """An NPU without triton-ascend has no inductor backend (torch_npu/_inductor): its compiled cells would fail at
    the first forward, so they are not run, and the report says why (report(), from device.compile_unavailable)."""
    for shape in ("345M", "1.3B"):
        eager = [label for label, _ in speed_grid(shape, True, 1024, compiles=False)]
        assert eager == [label for label in (label for label, _ in speed_grid(shape, True, 1024))
                         if not label.endswith(", torch.compile")]
        assert all("--torch-compile" not in flags for _, flags in speed_grid(shape, True, 1024, compiles=False))


def test_a_device_without_bf16_or_visible_fp16_overflow_is_checked_in_fp32_only(monkeypatch):
    """A first-generation Ascend 910 (its stand-in from test_launch_training: no bf16, fp16 saturating): the check
    trains no precision the trainer refuses there, and its speed cells run in fp32."""
    from deepspeed.accelerator import get_accelerator, set_accelerator
    from tests.tools.test_launch_training import FirstGenerationNpu, stand_in_torch_npu_utils
    previous = get_accelerator()
    set_accelerator(FirstGenerationNpu())
    monkeypatch.setattr(torch, "npu", stand_in_torch_npu_utils(inf_nan_mode=False), raising=False)
    try:
        assert half_precisions(on_accelerator=True) == []
    finally:
        set_accelerator(previous)
    assert half_precisions(on_accelerator=False) == ["--bf16"]
    assert all("--bf16" not in flags for _, flags in speed_grid("345M", True, 1024, bf16=False))


def test_with_several_devices_the_correctness_runs_leave_this_process_without_a_device():
    """With --nproc N the layout checks' processes use devices 0..N-1: the correctness trainings then run in fresh
    processes too, instead of an engine and cached memory held on device 0 by this process for the whole check."""
    called = []

    def pretrain(argv):
        called.append(argv)
    assert correctness_training(pretrain, nproc=2) is train_in_fresh_process
    assert called == []
    correctness_training(pretrain, nproc=1)(["--train-iters", "1"])  # one device: trained here, as before
    assert called == [["--train-iters", "1"]]
