"""Results tool: run directory -> summary figures, markdown table, summary lines and loss-curve PNG.

The logs are literal Megatron lines; every expected figure is worked out by hand in the comments.
"""
import json
import os
import struct
import subprocess
import sys

import pytest

from megatron.errors import InputError
from megatron.files.atomic import write_atomically
from megatron.reports.results import (format_parameter_count, gpt_parameter_count, markdown_table, read_run,
                                      steady_state_records, summary_lines, table_rows, upstream_rows)

from tests.helpers.paths import TOOLS

sys.path.insert(0, TOOLS)
import results_table  # noqa: E402
import summarize_run  # noqa: E402

DASHES = "-" * 93
# 5 iterations of global batch 8; samples/s 2, 4, 6, 8, 9; lm loss ends at 3.0. Validations at 2 and 4,
# a test evaluation at 5, and the noise a launcher mixes in (rank prefixes, warnings).
TINY_LOG = f"""\
[default0]:using world size: 8, data-parallel size: 2, tensor-model-parallel size: 2
 iteration        1/       5 | consumed samples:            8 | elapsed time per iteration (ms): 4000.0 | learning rate: 1.000E-04 | global batch size:     8 | lm loss: 1.050000E+01 | loss scale: 1.0 | grad norm: 5.000 | number of skipped iterations:   0 | number of nan iterations:   0 | samples per second: 2.000 | TFLOPs: 0.01 |
 iteration        2/       5 | consumed samples:           16 | elapsed time per iteration (ms): 2000.0 | learning rate: 2.000E-04 | global batch size:     8 | lm loss: 8.000000E+00 | loss scale: 1.0 | grad norm: 4.000 | number of skipped iterations:   0 | number of nan iterations:   0 | samples per second: 4.000 | TFLOPs: 0.02 |
{DASHES}
 validation loss at iteration 2 | lm loss value: 6.000000E+00 | lm loss PPL: 4.034288E+02 | 
{DASHES}
UserWarning: something unrelated
 iteration        3/       5 | consumed samples:           24 | elapsed time per iteration (ms): 1333.3 | learning rate: 3.000E-04 | global batch size:     8 | lm loss: 5.000000E+00 | loss scale: 1.0 | grad norm: 3.000 | number of skipped iterations:   0 | number of nan iterations:   0 | samples per second: 6.000 | TFLOPs: 0.03 |
[default7]: iteration        4/       5 | consumed samples:           32 | elapsed time per iteration (ms): 1000.0 | learning rate: 4.000E-04 | global batch size:     8 | lm loss: 4.000000E+00 | loss scale: 1.0 | grad norm: 2.000 | number of skipped iterations:   0 | number of nan iterations:   0 | samples per second: 8.000 | TFLOPs: 0.04 |
{DASHES}
 validation loss at iteration 4 | lm loss value: 3.500000E+00 | lm loss PPL: 3.311545E+01 | 
{DASHES}
 iteration        5/       5 | consumed samples:           40 | elapsed time per iteration (ms): 888.9 | learning rate: 5.000E-04 | global batch size:     8 | lm loss: 3.000000E+00 | loss scale: 1.0 | grad norm: 1.000 | number of skipped iterations:   0 | number of nan iterations:   0 | samples per second: 9.000 | TFLOPs: 0.05 |
 test loss at iteration 5 | lm loss value: 3.000000E+00 | lm loss PPL: 2.008554E+01 | 
"""
TINY_INFO = {"model_size": "tiny", "device": "cpu", "machine": "2-core test box", "world_size": 8,
             "nproc_per_node": 8, "seq_length": 128, "num_layers": 4, "hidden_size": 64,
             "padded_vocab_size": 512, "train_iters": 5, "global_batch_size": 8,
             "start_time": 1000.0, "end_time": 1123.6, "command": "extra keys are ignored"}
# Megatron-LM style: no samples/s field, so throughput = global batch / time: 16, 32, 40, 64.
GPU_LOG = """\
 iteration       10/     100 | consumed samples:          160 | elapsed time per iteration (ms): 1000.0 | global batch size:    16 | lm loss: 9.000000E+00 |
 iteration       20/     100 | consumed samples:          320 | elapsed time per iteration (ms): 500.0 | global batch size:    16 | lm loss: 5.000000E+00 |
 iteration       30/     100 | consumed samples:          480 | elapsed time per iteration (ms): 400.0 | global batch size:    16 | lm loss: 3.000000E+00 |
 iteration       40/     100 | consumed samples:          640 | elapsed time per iteration (ms): 250.0 | global batch size:    16 | lm loss: 2.000000E+00 |
"""
GPU_INFO = dict(TINY_INFO, model_size="345M", device="cuda", machine="8x test GPU", nproc_per_node=8,
                seq_length=1024, num_layers=24, hidden_size=1024, padded_vocab_size=50304, train_iters=100,
                global_batch_size=16, start_time=0, end_time=60)

TINY_ROW = "| tiny (CPU) | 241.0K | 33.115 | 8.500 | 0.045 | n/a | 128 | 5 |\n"
HEADER = ("| NAME (device) | params | PPL | samples/s | TFLOPs | MFU | seq_len | Steps |\n"
          "|---|---|---|---|---|---|---|---|\n")


def make_run(directory, log=TINY_LOG, info=TINY_INFO):
    os.makedirs(directory, exist_ok=True)
    if log is not None:
        with open(os.path.join(directory, "train.log"), "w") as handle:
            handle.write(log)
    if info is not None:
        with open(os.path.join(directory, "run.json"), "w") as handle:
            handle.write(info if isinstance(info, str) else json.dumps(info, indent=2))
    return str(directory)


def assert_valid_png(path, width=800, height=500):
    """PNG signature, the figure's pixel size in the IHDR chunk, a real drawing (not blank)."""
    with open(path, "rb") as handle:
        data = handle.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert data[12:16] == b"IHDR" and struct.unpack(">II", data[16:24]) == (width, height)
    assert len(data) > 10_000
    from matplotlib.image import imread
    pixels = imread(path)
    assert pixels.std() > 0.05  # axes, lines and text, not a uniform canvas
    assert not [name for name in os.listdir(os.path.dirname(path)) if name.endswith(".tmp")]


def test_parameter_count_follows_the_formula():
    # 345M: 50304·1024 + 1024·1024 + 24·(12·1024² + 13·1024) + 2·1024
    #     = 51,511,296 + 1,048,576 + 302,309,376 + 2,048
    assert gpt_parameter_count(24, 1024, 1024, 50304) == 354_871_296
    # tiny: 512·64 + 128·64 + 4·(12·64² + 13·64) + 2·64 = 32,768 + 8,192 + 199,936 + 128
    assert gpt_parameter_count(4, 64, 128, 512) == 241_024
    assert [format_parameter_count(n) for n in (354_871_296, 1_313_984_512, 241_024, 999)] == \
        ["354.9M", "1.31B", "241.0K", "999"]


@pytest.mark.parametrize("records, kept", [
    (40, 36),  # 10% = 4 > 3
    (31, 27),  # ceil(3.1) = 4
    (20, 17),  # 10% = 2 < 3
    (5, 2),
    (3, 1),    # nothing after warm-up: the last record alone
    (1, 1),
])
def test_warmup_skips_the_larger_of_three_records_and_ten_percent(records, kept):
    iterations = list(range(records))
    assert steady_state_records(iterations) == iterations[records - kept:]


def test_summary_figures_from_a_log(tmp_path):
    summary = read_run(make_run(tmp_path / "tiny")).summary
    assert summary.samples_per_second == pytest.approx(8.5)        # mean of 8 and 9 (records 4, 5)
    assert summary.final_train_ppl == pytest.approx(20.0855369)    # e³
    assert summary.best_validation_ppl == pytest.approx(33.11545)  # e^3.5; the test loss is not validation
    assert summary.reported_ppl == summary.best_validation_ppl    # a full run is judged by validation
    assert summary.steps == 5
    assert summary.duration_seconds == pytest.approx(123.6)


def test_throughput_from_batch_and_time_when_the_log_has_no_samples_per_second(tmp_path):
    summary = read_run(make_run(tmp_path / "gpu", GPU_LOG, GPU_INFO)).summary
    assert summary.samples_per_second == pytest.approx(64.0)  # 4 records, 3 warm-up: 16 / 0.25 s
    assert summary.best_validation_ppl is None
    assert summary.reported_ppl == summary.final_train_ppl  # no validation ran: the training PPL
    assert summary.steps == 40


def test_summary_lines_are_the_entry_scripts_three_lines(tmp_path):
    assert summary_lines(read_run(make_run(tmp_path / "tiny")).summary) == (
        "Final Performance samples/sec : 8.500\n"
        "Final Train lm loss PPL(accuracy): 33.115\n"
        "E2E Training Duration sec : 124\n")


def test_markdown_table_of_our_runs(tmp_path):
    runs = [read_run(make_run(tmp_path / "tiny")), read_run(make_run(tmp_path / "gpu", GPU_LOG, GPU_INFO))]
    assert markdown_table(table_rows(runs)) == (
        HEADER + TINY_ROW + "| 345M (GPU) | 354.9M | 7.389 | 64.000 | - | n/a | 1024 | 40 |\n")


def test_upstream_rows_go_beside_ours_of_the_same_size(tmp_path):
    runs = [read_run(make_run(tmp_path / "gpu", GPU_LOG, GPU_INFO)), read_run(make_run(tmp_path / "tiny"))]
    assert markdown_table(table_rows(runs, with_upstream=True)) == (
        HEADER
        + "| 345M (GPU) | 354.9M | 7.389 | 64.000 | - | n/a | 1024 | 40 |\n"
        + "| 345M (GPU, upstream) | 354.9M | 26.375 | 37.8 | - | - | 1024 | - |\n"
        + "| 345M (NPU, upstream) | 354.9M | 26.485 | 59.7 | - | - | 1024 | - |\n"
        + TINY_ROW)  # upstream published nothing for tiny


def test_upstream_params_use_gpt2_vocab_padded_for_the_presets_tp():
    # TP 2 pads 50257 to a multiple of 256 = 50432.
    # 1.3B: 50432·2048 + 1024·2048 + 24·(12·2048² + 13·2048) + 2·2048 = 1,313,984,512
    # 2.7B: 50432·2560 + 2048·2560 + 32·(12·2560² + 13·2560) + 2·2560 = 2,651,001,280
    # 3.7B: 50432·3072 + 2048·3072 + 32·(12·3072² + 13·3072) + 2·3072 = 3,786,381,312
    assert [(row.name, row.params, row.ppl, row.samples_per_second, row.seq_len)
            for size in ("1.3B", "2.7B", "3.7B") for row in upstream_rows(size)] == [
        ("1.3B (GPU, upstream)", "1.31B", "-", "15.71", "1024"),
        ("1.3B (NPU, upstream)", "1.31B", "-", "21.47", "1024"),
        ("2.7B (GPU, upstream)", "2.65B", "-", "4.125", "2048"),
        ("2.7B (NPU, upstream)", "2.65B", "-", "5.280", "2048"),
        ("3.7B (GPU, upstream)", "3.79B", "-", "3.120", "2048"),
        ("3.7B (NPU, upstream)", "3.79B", "-", "4.558", "2048")]
    assert [row.samples_per_second for row in upstream_rows("345M_without_mp")] == ["235", "227"]
    assert upstream_rows("tiny") == []


def test_summarize_run_prints_three_lines_and_draws_the_loss_curve(tmp_path, capsys):
    run_dir = make_run(tmp_path / "tiny")
    summarize_run.main([run_dir])
    assert capsys.readouterr().out == (
        "Final Performance samples/sec : 8.500\n"
        "Final Train lm loss PPL(accuracy): 33.115\n"
        "E2E Training Duration sec : 124\n")
    assert_valid_png(os.path.join(run_dir, "loss_curve.png"))


def test_results_table_cli_prints_and_writes_table_and_plot(tmp_path, capsys):
    tiny = make_run(tmp_path / "runs" / "tiny")
    gpu = make_run(tmp_path / "runs" / "gpu", GPU_LOG, GPU_INFO)
    out = tmp_path / "out"
    out.mkdir()
    results_table.main([tiny, gpu, "--upstream", "--markdown", str(out / "results.md"),
                        "--plot", str(out / "curves.png")])
    printed = capsys.readouterr().out
    assert printed.startswith(HEADER + TINY_ROW + "| 345M (GPU) | 354.9M | 7.389 | 64.000 | - | n/a | 1024 | 40 |\n"
                              "| 345M (GPU, upstream) |")
    assert "- tiny (CPU) [tiny]: 2-core test box, 8 processes (8 per node)\n" in printed
    assert "- 345M (GPU) [gpu]: 8x test GPU, 8 processes (8 per node)\n" in printed
    assert "- upstream: " in printed
    assert (out / "results.md").read_text() == printed
    assert os.stat(out / "results.md").st_mode & 0o777 == 0o644
    assert_valid_png(str(out / "curves.png"))


@pytest.mark.parametrize("log, info, message", [
    (None, TINY_INFO, r"train\.log not found.*did the run start"),
    ("Traceback (most recent call last):\nRuntimeError: out of memory\n", TINY_INFO,
     r"train\.log: no iteration lines.*failed before its first --log-interval"),
    (TINY_LOG, None, r"run\.json not found.*did not finish"),
    (TINY_LOG, '{"model_size": "tiny",\n "device": }', r"run\.json:2:\d+: not valid JSON"),
    (TINY_LOG, dict(TINY_INFO, seq_length="128"), r"run\.json: key 'seq_length' is '128', expected a positive"),
    (TINY_LOG, dict(TINY_INFO, num_layers=True), r"key 'num_layers' is True"),
    (TINY_LOG, {k: v for k, v in TINY_INFO.items() if k != "padded_vocab_size"},
     r"key 'padded_vocab_size' is missing, expected a positive whole number"),
    (TINY_LOG, dict(TINY_INFO, end_time=999.0), r"end_time 999\.0 is before start_time 1000\.0"),
    (" iteration        1/       5 | consumed samples:            8 | samples per second: 2.000 |"
     " number of skipped iterations:   1 |\n", TINY_INFO, r"no iteration line carries 'lm loss'"),
    (" iteration        1/       5 | lm loss: 1.0E+00 |\n", TINY_INFO, r"neither 'samples per second'"),
])
def test_bad_run_directories_raise_input_errors_naming_the_file(tmp_path, log, info, message):
    run_dir = make_run(tmp_path / "run", log, info)
    with pytest.raises(InputError, match=message) as caught:
        read_run(run_dir)
    assert str(tmp_path / "run") in str(caught.value)


def test_missing_run_directory(tmp_path):
    with pytest.raises(InputError, match=r"nowhere does not exist.*test/train_full_8p\.sh"):
        read_run(str(tmp_path / "nowhere"))


def test_failed_write_leaves_neither_output_nor_temporary(tmp_path):
    def write_then_fail(handle):
        handle.write(b"half")
        raise OSError("disk full")
    with pytest.raises(OSError):
        write_atomically(str(tmp_path / "table.md"), write_then_fail)
    assert os.listdir(tmp_path) == []


def test_cli_reports_bad_input_in_one_line_from_any_directory(tmp_path):
    run_dir = make_run(tmp_path / "run", log=None)
    result = subprocess.run([sys.executable, os.path.join(TOOLS, "summarize_run.py"), run_dir],
                            cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert "train.log not found" in result.stderr


def test_output_into_a_missing_directory_is_an_input_error(tmp_path):
    run_dir = make_run(tmp_path / "tiny")
    with pytest.raises(InputError, match=r"cannot write .*curves\.png: directory .*absent does not exist"):
        results_table.main([run_dir, "--plot", str(tmp_path / "absent" / "curves.png")])


def test_tflops_and_mfu_cells_are_means_after_warm_up(tmp_path):
    from megatron.training.log_lines import iteration_line
    lines = [iteration_line(i, 5, 8 * i, 100.0, 1e-4, 8, 3.0, 1.0, 1.0, 0, 0, 80.0, 100.0 * i, 0.1 * i)
             for i in range(1, 6)]
    run = read_run(make_run(tmp_path / "accelerated", "\n".join(lines) + "\n", dict(TINY_INFO, device="cuda")))
    assert (run.summary.tflops, run.summary.mfu) == (pytest.approx(450.0), pytest.approx(0.45))  # records 4, 5
    row = table_rows([run])[0]
    assert (row.tflops, row.mfu) == ("450", "45.0%")
