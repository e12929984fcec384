"""Preprocessing that is interrupted or has nothing to write: no orphaned workers, no half-written or empty
dataset in place of a good one, one line for Ctrl-C."""
import glob
import json
import os
import signal
import subprocess
import sys

import numpy as np
import psutil
import pytest

from megatron.data.preprocess import PreprocessOptions, preprocess
from megatron.errors import InputError
from megatron.tokenizer import build_tokenizer
from tests.helpers.paths import TOOLS

pytestmark = pytest.mark.full  # real processes killed mid-run: the full tier



def write_numbers(path, documents, words=200):
    """JSONL for the NullTokenizer: each document `words` ids below 1000."""
    rng = np.random.default_rng(0)
    with open(path, "w") as handle:
        for _ in range(documents):
            handle.write(json.dumps({"text": " ".join(map(str, rng.integers(0, 1000, words)))}) + "\n")
    return str(path)


def convert(source, prefix, **options):
    return preprocess(PreprocessOptions(input_pattern=str(source), output_prefix=str(prefix), **options),
                      build_tokenizer("NullTokenizer", vocab_size=1000), log=lambda message: None)


def file_bytes(prefix):
    return [open(f"{prefix}{suffix}", "rb").read() for suffix in (".bin", ".idx")]


def test_an_input_without_text_never_replaces_a_dataset(tmp_path):
    convert(write_numbers(tmp_path / "good.jsonl", 10), tmp_path / "out")
    kept = file_bytes(tmp_path / "out_text_document")
    (tmp_path / "empty.jsonl").write_text('{"text": ""}\n{"text": " "}\n')
    with pytest.raises(InputError, match=r"no text to write \(2 documents, 0 tokens for --json-keys text\), so "
                                         r"nothing was written and any existing output is kept"):
        convert(tmp_path / "empty.jsonl", tmp_path / "out")
    assert file_bytes(tmp_path / "out_text_document") == kept
    convert(tmp_path / "empty.jsonl", tmp_path / "out", allow_empty=True)  # when asked for
    assert file_bytes(tmp_path / "out_text_document") != kept


def start_preprocessing(source, prefix):
    """tools/preprocess_data.py with 2 workers, in its own process group and with Ctrl-C's default action (as a
    terminal's foreground job has it, whatever the test runner inherited: a shell's background job ignores
    SIGINT); returns the process once it has reported progress."""
    process = subprocess.Popen([sys.executable, os.path.join(TOOLS, "preprocess_data.py"), "--input", source,
                                "--output-prefix", str(prefix), "--tokenizer-type", "NullTokenizer", "--vocab-size",
                                "1000", "--workers", "2", "--log-interval", "500"],
                               stderr=subprocess.PIPE, text=True, start_new_session=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    for line in process.stderr:
        if line.startswith("Processed"):
            return process
    raise AssertionError(f"no progress line; exit {process.wait()}")


def test_killed_preprocessing_leaves_no_workers_and_its_temporaries_go_at_the_next_run(tmp_path):
    source = write_numbers(tmp_path / "in.jsonl", 60_000)
    process = start_preprocessing(source, tmp_path / "out")
    workers = psutil.Process(process.pid).children()
    assert len(workers) == 2
    process.kill()
    process.wait()
    gone, alive = psutil.wait_procs(workers, timeout=15)
    assert not alive
    assert glob.glob(str(tmp_path / "out_text_document.*.tmp"))
    convert(write_numbers(tmp_path / "small.jsonl", 5), tmp_path / "out")
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl", "out_text_document.bin", "out_text_document.idx",
                                            "small.jsonl"]


def test_ctrl_c_stops_preprocessing_with_one_line_and_exit_130(tmp_path):
    source = write_numbers(tmp_path / "in.jsonl", 60_000)
    process = start_preprocessing(source, tmp_path / "out")
    workers = psutil.Process(process.pid).children()
    os.killpg(process.pid, signal.SIGINT)  # what Ctrl-C does: the whole foreground group
    rest = process.stderr.read()
    assert process.wait(timeout=60) == 130
    assert [line for line in rest.splitlines() if not line.startswith("Processed")] == ["error: interrupted (Ctrl-C)"]
    assert not psutil.wait_procs(workers, timeout=15)[1]
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl"]


def test_a_second_run_on_the_same_output_prefix_is_refused_while_the_first_writes(tmp_path):
    first = start_preprocessing(write_numbers(tmp_path / "in.jsonl", 60_000), tmp_path / "out")
    try:
        with pytest.raises(InputError, match=rf"dataset '{tmp_path}/out_text_document' is being written by another "
                                             rf"run \(pid {first.pid} on host "):
            convert(write_numbers(tmp_path / "small.jsonl", 5), tmp_path / "out")
    finally:
        first.kill()
        first.wait()
    convert(tmp_path / "small.jsonl", tmp_path / "out")  # the killed writer's claim went with it
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl", "out_text_document.bin", "out_text_document.idx",
                                            "small.jsonl"]
