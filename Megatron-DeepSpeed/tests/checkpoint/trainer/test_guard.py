"""Start-up checks of --load / --save, the `latest` pair, and the words of a failed write: on real files."""
import errno
import os
import subprocess

import pytest
import torch

from megatron.checkpoint.trainer.guard import check_checkpoint_directories, latest_tag
from megatron.checkpoint.trainer.save import publish_latest
from megatron.errors import InputError
from megatron.files.storage import free_bytes, megabytes, write_failure_cause


def write_step(directory, iteration):
    """The step directory a save at `iteration` writes: its client state."""
    step = directory / f"global_step{iteration}"
    step.mkdir(parents=True)
    args = {"num_layers": 2, "tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1,
            "data_parallel_size": 1, "zero_stage": 0, "no_pipeline_parallel": True}
    torch.save({"args": args, "iteration": iteration, "module": {}}, step / "mp_rank_00_model_states.pt")
    return step


def make_checkpoint(directory, iteration):
    """A directory as a save at `iteration` leaves it: the step, and `latest`."""
    step = write_step(directory, iteration)
    publish_latest(str(directory), step.name)
    return step


def test_a_mistyped_load_is_refused_and_names_the_path(tmp_path):
    save = tmp_path / "ck"
    make_checkpoint(save, 10)
    with pytest.raises(InputError, match=f"--load {tmp_path}/ckk holds no checkpoint \\(it does not exist; it is "
                                         f"not --save {save}\\)"):
        check_checkpoint_directories(str(tmp_path / "ckk"), str(save))
    assert latest_tag(str(save)) == "global_step10"


@pytest.mark.parametrize("prepare", [lambda path: None, os.makedirs])
def test_load_equal_to_save_may_be_missing_or_empty(prepare, tmp_path):
    directory = tmp_path / "ck"
    prepare(directory)
    assert check_checkpoint_directories(f"{directory}/", str(directory)) is None  # a fresh start
    assert os.path.isdir(directory)  # and --save is ready


def test_load_equal_to_save_resumes_its_checkpoint(tmp_path):
    make_checkpoint(tmp_path, 10)
    assert check_checkpoint_directories(str(tmp_path), str(tmp_path)) == str(tmp_path)


def test_a_save_directory_with_a_newer_checkpoint_is_never_rolled_back(tmp_path):
    older, newer = tmp_path / "older", tmp_path / "newer"
    make_checkpoint(older, 5)
    make_checkpoint(newer, 10)
    with pytest.raises(InputError, match="holds a checkpoint of iteration 10 .*start from iteration 5 of --load"):
        check_checkpoint_directories(str(older), str(newer))
    with pytest.raises(InputError, match="iteration 10 .*start from scratch .*roll 'latest' back from 10"):
        check_checkpoint_directories(None, str(newer))
    assert check_checkpoint_directories(str(newer), str(older)) == str(newer)  # moving forward is fine


def test_save_must_be_writable_at_start_up(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(InputError, match=f"--save {tmp_path}/file/ck is not a writable directory"):
        check_checkpoint_directories(None, str(tmp_path / "file" / "ck"))


def test_latest_naming_a_missing_step_is_reported_with_the_file(tmp_path):
    make_checkpoint(tmp_path, 10)
    os.rename(tmp_path / "global_step10", tmp_path / "moved")
    with pytest.raises(InputError, match=f"{tmp_path}/latest names global_step10, but {tmp_path}/global_step10 "
                                         "does not exist"):
        check_checkpoint_directories(str(tmp_path), None)


def test_a_truncated_checkpoint_file_is_named(tmp_path):
    step = make_checkpoint(tmp_path, 10)
    states = step / "mp_rank_00_model_states.pt"
    states.write_bytes(states.read_bytes()[:200])
    with pytest.raises(InputError, match=f"checkpoint file {states} is truncated"):
        check_checkpoint_directories(str(tmp_path), str(tmp_path))


def link_layout(directory, iteration):
    """A directory as older saves left it: both pointers links through `.latest` -> `.latest.global_stepN/`."""
    write_step(directory, iteration)
    pointers = directory / f".latest.global_step{iteration}"
    pointers.mkdir()
    (pointers / "latest").write_text(f"global_step{iteration}")
    (pointers / "latest_checkpointed_iteration.txt").write_text(str(iteration))
    os.symlink(pointers.name, directory / ".latest")
    for name in ("latest", "latest_checkpointed_iteration.txt"):
        os.symlink(os.path.join(".latest", name), directory / name)


def test_the_pointers_are_plain_files_replacing_the_link_layout_which_still_resumes(tmp_path):
    link_layout(tmp_path, 5)
    assert latest_tag(str(tmp_path)) == "global_step5"  # an older save's links are read as they were
    assert check_checkpoint_directories(str(tmp_path), str(tmp_path)) == str(tmp_path)
    (tmp_path / ".latest.7f3a.tmp").write_text("global_step")  # what a save killed mid-write leaves
    (tmp_path / ".latest_checkpointed_iteration.txt.9c1e.tmp").write_text("")
    (tmp_path / ".latest_notes").write_text("a user's")  # not the project's: kept
    for iteration in (10, 20):
        (tmp_path / f"global_step{iteration}").mkdir()
        publish_latest(str(tmp_path), f"global_step{iteration}")
        written = {"latest": f"global_step{iteration}", "latest_checkpointed_iteration.txt": str(iteration)}
        for name, text in written.items():
            assert not os.path.islink(tmp_path / name) and (tmp_path / name).read_text() == text
    assert sorted(name for name in os.listdir(tmp_path) if name.startswith(".")) == [".latest_notes"]


def test_a_copy_of_the_runs_visible_files_resumes(tmp_path):
    """`cp -r run/* dst/` leaves hidden files behind: with `latest` a link to `.latest/latest` it dangled."""
    run, copy = tmp_path / "run", tmp_path / "copy"
    make_checkpoint(run, 10)
    copy.mkdir()
    subprocess.run(f"cp -r {run}/* {copy}/", shell=True, check=True)
    assert latest_tag(str(copy)) == "global_step10"
    assert check_checkpoint_directories(str(copy), str(copy)) == str(copy)
    assert (copy / "latest_checkpointed_iteration.txt").read_text() == "10"


@pytest.mark.parametrize("code, words", [
    (errno.ENOSPC, "the disk is full (ENOSPC): "),
    (errno.EROFS, "the file system is read-only (EROFS)"),
    (errno.EACCES, "permission denied (EACCES)"),
])
def test_a_failed_write_is_explained(code, words, tmp_path):
    cause = write_failure_cause(str(tmp_path), OSError(code, os.strerror(code)), 40_000_000)
    assert cause.startswith(words)
    if code == errno.ENOSPC:
        assert cause.endswith("yet it ran out while writing: it needs more than the estimated 40.0 MB, or something "
                              "else fills that disk")
        beyond = 2 * free_bytes(str(tmp_path))
        assert write_failure_cause(str(tmp_path), OSError(code, "full"), beyond).endswith(
            f"free there, about {megabytes(beyond)} needed")
