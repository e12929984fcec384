"""Start-up checks of --load / --save, the `latest` pair, and the words of a failed write: on real files."""
import errno
import os

import pytest
import torch

from megatron.checkpoint.trainer.guard import check_checkpoint_directories, latest_tag
from megatron.checkpoint.trainer.save import publish_latest
from megatron.errors import InputError
from megatron.files.storage import free_bytes, megabytes, write_failure_cause


def make_checkpoint(directory, iteration):
    """A directory as a save at `iteration` leaves it: the step's client state, and `latest`."""
    step = directory / f"global_step{iteration}"
    step.mkdir(parents=True)
    args = {"num_layers": 2, "tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1,
            "data_parallel_size": 1, "zero_stage": 0, "no_pipeline_parallel": True}
    torch.save({"args": args, "iteration": iteration, "module": {}}, step / "mp_rank_00_model_states.pt")
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


def test_latest_and_its_iteration_file_name_the_same_checkpoint(tmp_path):
    (tmp_path / "latest").write_text("global_step5")  # an older layout's plain files are replaced
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("5")
    for iteration in (10, 20):
        (tmp_path / f"global_step{iteration}").mkdir()
        publish_latest(str(tmp_path), f"global_step{iteration}")
        assert (tmp_path / "latest").read_text() == f"global_step{iteration}"
        assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == str(iteration)
    # Both are links through the one link that a save replaces in a single rename.
    assert os.readlink(tmp_path / "latest") == os.path.join(".latest", "latest")
    assert os.readlink(tmp_path / "latest_checkpointed_iteration.txt") == os.path.join(
        ".latest", "latest_checkpointed_iteration.txt")
    assert sorted(name for name in os.listdir(tmp_path) if name.startswith(".latest")) == [
        ".latest", ".latest.global_step20"]


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
