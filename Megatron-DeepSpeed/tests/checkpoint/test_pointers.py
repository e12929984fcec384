"""What a checkpoint directory's pointer files and manifest name is data (megatron/checkpoint/pointers.py): a
name leading outside the directory, a pointer that is a link outside, a FIFO, an oversized or odd pointer, a
malformed manifest, each refused in one line by the trainer's start-up check and by the tools' reader; and a
--save path with glob characters resumes (megatron/files/glob_free.py)."""
import json
import os
import shutil
import subprocess
import sys

import pytest
from tests.helpers.distributed import run_on_ranks
from tests.checkpoint.reshape.test_conversions import hf_model
from tests.helpers.training import COMMON, ITERATIONS

from megatron.hf.conversions import import_hf
from megatron.checkpoint.formats.detect import read_client_state
from megatron.checkpoint.formats.locate import checkpoint_directory
from megatron.checkpoint.trainer.guard import check_checkpoint_directories
from megatron.checkpoint.file_names import LATEST_ITERATION_FILE, LATEST_TAG_FILE, MANIFEST_FILE
from megatron.checkpoint.reshape.target_writer import TargetLayout
from megatron.errors import InputError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Two imported checkpoints side by side: `ckpt` (global_step0) and `other` (another run's)."""
    directory = tmp_path_factory.mktemp("pointers")
    hf_model().save_pretrained(directory / "hf")
    import_hf(str(directory / "hf"), str(directory / "ckpt"), TargetLayout(1, 1), make_vocab_size_divisible_by=32)
    shutil.copytree(directory / "ckpt", directory / "other")
    return directory


def replace_pointer(copy, name, make):
    path = os.path.join(copy, name)
    if os.path.lexists(path):
        os.remove(path)
    make(path)


def write(text):
    return lambda path: open(path, "w").write(text)


def edit_manifest(files):
    def make(copy):
        path = os.path.join(copy, "global_step0", MANIFEST_FILE)
        with open(path) as handle:
            manifest = json.load(handle)
        with open(path, "w") as handle:
            json.dump({**manifest, "files": files(manifest["files"])}, handle)
    return make


POINTERS = {  # case: (file, how it is made, what the one line says)
    "step leaving the directory": (LATEST_TAG_FILE, write("global_step0/../../other/global_step0"),
                                   "not a checkpoint name like 'global_step1000'"),
    "walk up the file system": (LATEST_TAG_FILE, write("global_step0/../../../../../.."), "not a checkpoint name"),
    "link outside": (LATEST_TAG_FILE, lambda path: os.symlink("/etc/passwd", path), "leads outside"),
    "FIFO": (LATEST_TAG_FILE, os.mkfifo, "is not a regular file"),
    "10 MB": (LATEST_TAG_FILE, write("global_step0" * 900_000), "holds more than 256 bytes"),
    "superscript two": (LATEST_ITERATION_FILE, write("\u00b2"), "neither an iteration number nor 'release'"),
    "5000 digits": (LATEST_ITERATION_FILE, write("9" * 5000), "holds more than 256 bytes"),
}
MANIFESTS = {
    "no files": (lambda files: [], "not a mapping of the checkpoint's files"),
    "an integer entry": (lambda files: {**files, "mp_rank_00_model_states.pt": 7}, "the entry of"),
    "a name outside": (lambda files: {**files, "../../../../../etc/passwd": {"bytes": 1, "crc32_ends": "0"}},
                       "leads outside"),
}


def damaged(checkpoints, tmp_path, case):
    copy = str(tmp_path / "ckpt")
    shutil.copytree(checkpoints / "ckpt", copy, symlinks=True)
    if case in POINTERS:
        name, make, message = POINTERS[case]
        if name == LATEST_ITERATION_FILE:  # the Megatron pointer is read when there is no `latest`
            os.remove(os.path.join(copy, LATEST_TAG_FILE))
            os.remove(os.path.join(copy, "latest_universal"))
        replace_pointer(copy, name, make)
    else:
        edit, message = MANIFESTS[case]
        edit_manifest(edit)(copy)
    return copy, message


def one_line_refusal(action):
    with pytest.raises(InputError) as refusal:
        action()
    message = str(refusal.value)
    assert "\n" not in message and len(message) < 600 and "root:" not in message, message
    return message


@pytest.mark.parametrize("case", [*POINTERS, *MANIFESTS])
def test_the_trainer_and_the_tools_refuse_in_one_line(checkpoints, tmp_path, case):
    copy, expected = damaged(checkpoints, tmp_path, case)
    for action in (lambda: check_checkpoint_directories(copy, None),
                   lambda: read_client_state(checkpoint_directory(copy))):
        assert expected in one_line_refusal(action)


def test_inspect_checkpoint_refuses_a_pointer_outside_with_exit_2(checkpoints, tmp_path):
    copy, _ = damaged(checkpoints, tmp_path, "step leaving the directory")
    result = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "inspect_checkpoint.py"), copy],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "not a checkpoint name like 'global_step1000'" in result.stderr.strip().splitlines()[-1]


def test_a_link_to_a_step_elsewhere_is_refused(checkpoints, tmp_path):
    copy = str(tmp_path / "ckpt")
    shutil.copytree(checkpoints / "ckpt", copy, symlinks=True)
    shutil.rmtree(os.path.join(copy, "global_step0"))
    os.symlink(checkpoints / "other" / "global_step0", os.path.join(copy, "global_step0"))
    assert "leads outside" in one_line_refusal(lambda: checkpoint_directory(copy))


def pretrain_losses(argv):
    from megatron.model.provider import model_provider
    from megatron.training.loop import pretrain
    return pretrain(model_provider, argv).losses


@pytest.mark.full
def test_a_save_directory_with_glob_characters_resumes(data_prefix, tmp_path):
    save = str(tmp_path / "run[lr=1e-3]")
    flags = [*COMMON, "--data-path", data_prefix, "--save", save, "--save-interval", str(ITERATIONS),
             "--lr-decay-iters", "100"]
    run_on_ranks(pretrain_losses, 1, flags, timeout=300)
    losses, = run_on_ranks(pretrain_losses, 1, [*flags, "--load", save, "--train-iters", str(ITERATIONS + 1)],
                           timeout=300)
    assert len(losses) == 1 and sorted(os.listdir(save)).count(f"global_step{ITERATIONS + 1}") == 1
