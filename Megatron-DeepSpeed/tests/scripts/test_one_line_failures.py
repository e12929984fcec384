"""User mistakes that used to end in a traceback, an absurd allocation or a misleading message, each refused in
one line naming the file or flag (or, for blend weights, accepted as meant), on real files
(docs/failure-cases.md)."""
import ctypes
import ctypes.util
import json
import os
import shutil
import sys
import tempfile
import traceback

import numpy as np
import pytest
from tests.checkpoint.reshape.test_conversions import HF_VOCAB, hf_model

from megatron.hf.conversions import import_hf
from megatron.hf.examine import examine
from megatron.checkpoint.reshape.target_writer import TargetLayout
from megatron.data.blendable_dataset import BlendableDataset
from megatron.data.token_range import check_token_ids
from megatron.errors import InputError
from megatron.inference.sampling import SamplingParams


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("hf") / "gpt2"
    hf_model().save_pretrained(directory)
    return directory


def with_config(hf_dir, tmp_path, **changes):
    """A copy of `hf_dir` whose config.json has `changes`."""
    copy = tmp_path / "hf"
    copy.mkdir()
    for file in hf_dir.iterdir():
        (copy / file.name).write_bytes(file.read_bytes())
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, **changes}))
    return copy


@pytest.mark.parametrize("changes, message", [
    ({"n_inner": 64}, "tensor 'transformer.h.0.mlp.c_fc.bias' has shape [48], but "),
    ({"vocab_size": HF_VOCAB + 20}, f"tensor 'transformer.wte.weight' has shape [{HF_VOCAB}, 32], but "),
    ({"vocab_size": 1e12}, "sets vocab_size=1000000000000.0; it must be the whole number of rows"),
    ({"vocab_size": 10 ** 12}, "sets vocab_size=1000000000000; it must be the whole number of rows"),
    ({"n_inner": 64}, "config.json describes [64]: the weights and config.json belong to different models"),
])
def test_hf_weights_must_have_the_shapes_config_json_gives(hf_dir, tmp_path, changes, message):
    source = with_config(hf_dir, tmp_path, **changes)
    for read in (lambda: import_hf(str(source), str(tmp_path / "ckpt"), TargetLayout(1, 1), 32),
                 lambda: examine(str(source))):
        with pytest.raises(InputError) as refusal:
            read()
        assert message in str(refusal.value) and "\n" not in str(refusal.value)


@pytest.mark.parametrize("temperature", [float("nan"), float("inf"), 0.0])
def test_a_temperature_that_is_not_a_positive_number_is_refused(temperature):
    with pytest.raises(InputError, match=rf"--temperature {temperature} must be a finite number greater than 0"):
        SamplingParams(greedy=False, temperature=temperature)


def test_a_missing_data_prefix_is_named(tmp_path):
    with pytest.raises(InputError, match=rf"{tmp_path}/absent_text_document.idx not found"):
        check_token_ids([str(tmp_path / "absent_text_document")], 256, str(tmp_path / "cache"))


def test_blend_weights_whose_sum_overflows_are_still_relative():
    datasets = [list(range(100)), list(range(100))]
    blend = BlendableDataset(datasets, ["1e308", "1e308"], 50)
    assert blend.weights.tolist() == [0.5, 0.5]
    assert np.bincount(blend.dataset_index).tolist() == [25, 25]


# --- files this user may not read --------------------------------------------------------------------------------

_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH = 1, 2  # <linux/capability.h>
_CAPABILITY_VERSION_3 = 0x20080522


def read_as_file_permissions_say():
    """Give up root's override of file permissions (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH), in this process:
    the tests run as root, whom permissions do not stop. The user stays root, so the interpreter and the
    modules it has yet to import (under root's home) stay readable, as they are for a user who owns them."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    header = (ctypes.c_uint32 * 2)(_CAPABILITY_VERSION_3, 0)
    sets = (ctypes.c_uint32 * 6)()  # (effective, permitted, inheritable) x 2 words
    assert libc.capget(header, sets) == 0, ctypes.get_errno()
    for index in (0, 1):  # effective and permitted, first word (capabilities 0-31)
        sets[index] &= ~((1 << _CAP_DAC_OVERRIDE) | (1 << _CAP_DAC_READ_SEARCH))
    assert libc.capset(header, sets) == 0, ctypes.get_errno()


def run_cli_without_root_file_access(main, argv) -> tuple[int, str]:
    """run_cli(main, argv) in a child forked from this process, without root's file access: its exit status
    and what it wrote to stderr."""
    from megatron.errors import run_cli

    with tempfile.TemporaryFile() as stderr:
        child = os.fork()
        if child == 0:  # pragma: no cover (the child)
            status = 1
            try:
                os.dup2(stderr.fileno(), 2)
                os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
                sys.stdout, sys.stderr = open(1, "w", closefd=False), open(2, "w", closefd=False)
                read_as_file_permissions_say()
                run_cli(main, argv)
                status = 0
            except SystemExit as end:
                status = end.code if isinstance(end.code, int) else 1
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stderr.flush()
                os._exit(status)
        _, wait_status = os.waitpid(child, 0)
        stderr.seek(0)
        return os.waitstatus_to_exitcode(wait_status), stderr.read().decode(errors="replace")


@pytest.fixture(scope="module")
def imported(hf_dir, tmp_path_factory):
    checkpoint = tmp_path_factory.mktemp("unreadable") / "ckpt"
    import_hf(str(hf_dir), str(checkpoint), TargetLayout(1, 1), make_vocab_size_divisible_by=32)
    return checkpoint


def entry_points(load: str, out: str) -> dict:
    """Training and every tool that reads a checkpoint, each given `load`."""
    from pretrain_gpt import main as train
    from tasks.zeroshot_gpt.evaluate import main as evaluate
    from tools.convert_checkpoint import main as convert
    from tools.generate_text import main as generate
    from tools.inspect_checkpoint import main as inspect

    text = os.path.join(out, "wiki.txt")
    with open(text, "w") as handle:
        handle.write("1 2 3 4 5 6 7 8\n")
    tokens = ["--tokenizer-type", "NullTokenizer", "--vocab-size", str(HF_VOCAB - 1)]
    return {
        "training": (train, [*TRAINING_FLAGS, "--mock-data", "--load", load, "--finetune"]),
        "inspect_checkpoint": (inspect, [load]),
        "convert_checkpoint (reshape)": (convert, ["--load", load, "--save", os.path.join(out, "tp2"),
                                                   "--target-tensor-parallel-size", "2"]),
        "convert_checkpoint --to-hf": (convert, ["--load", load, "--to-hf", os.path.join(out, "hf")]),
        "generate_text": (generate, ["--load", load, "--prompt", "1 2", *tokens, "--max-new-tokens", "1"]),
        "zero-shot evaluation": (evaluate, ["--load", load, "--task", "WIKITEXT103", "--valid-data", text, *tokens]),
    }


TRAINING_FLAGS = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
                  "--max-position-embeddings", "16", "--ffn-hidden-size", "48", "--micro-batch-size", "1",
                  "--train-iters", "1", "--lr", "1e-3", "--tokenizer-type", "NullTokenizer", "--vocab-size",
                  str(HF_VOCAB - 1), "--make-vocab-size-divisible-by", "32", "--eval-iters", "0"]


@pytest.mark.parametrize("unreadable", ["the --load directory", "a shard"])
def test_a_checkpoint_this_user_cannot_read_is_named_in_one_line_by_training_and_every_tool(imported, tmp_path,
                                                                                             unreadable):
    load = tmp_path / "ckpt"
    shutil.copytree(imported, load)
    target = load if unreadable == "the --load directory" else load / "global_step0" / "mp_rank_00_model_states.pt"
    target.chmod(0)
    try:
        for name, (main, argv) in entry_points(str(load), str(tmp_path)).items():
            status, stderr = run_cli_without_root_file_access(main, argv)
            lines = [line for line in stderr.splitlines() if line.startswith("error: ")]
            assert status == 2 and len(lines) == 1 and "Traceback" not in stderr, f"{name}: {stderr[-3000:]}"
            assert str(target) in lines[0] and "ermission denied" in lines[0], f"{name}: {lines[0]}"
    finally:
        target.chmod(0o755)
