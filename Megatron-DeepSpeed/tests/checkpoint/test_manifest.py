"""A damaged checkpoint is named in one line before anything loads it: each damaged file of a TP 2 x PP 2
checkpoint (missing model-states or pipeline-piece file, a shard truncated to 2 bytes, a file that loads but is
not what its name says), with the manifest written beside the checkpoint and without one (older checkpoints,
upstream's: checked from the layout), for the tools (reader) and for the trainer's start-up check."""
import os
import shutil

import pytest
import torch
from tests.helpers.distributed import run_on_ranks
from tests.checkpoint.reshape.test_conversions import hf_model
from tests.helpers.training import COMMON, write_counting_dataset

from megatron.checkpoint import manifest
from megatron.hf.conversions import import_hf
from megatron.checkpoint.trainer.guard import check_checkpoint_directories
from megatron.checkpoint.file_names import MANIFEST_FILE
from megatron.checkpoint.formats.reader import read_checkpoint
from megatron.checkpoint.reshape.target_writer import TargetLayout
from megatron.errors import InputError


def missing(path):
    os.remove(path)


def truncated_to_2_bytes(path):
    with open(path, "r+b") as handle:
        handle.truncate(2)


def without_module(path):
    state = torch.load(path, weights_only=False)  # the test's own file
    del state["module"]
    torch.save(state, path)


# (file, damage, message with the manifest, message without it)
DAMAGES = {
    "missing client state": ("mp_rank_03_model_states.pt", missing, "is missing", "is missing"),
    "missing piece": ("layer_03-model_01-model_states.pt", missing, "is missing", "is missing"),
    "shard of 2 bytes": ("layer_01-model_00-model_states.pt", truncated_to_2_bytes,
                         r"has 2 bytes, but \d+ were written", r"is truncated \(2 bytes"),
    "no module": ("mp_rank_01_model_states.pt", without_module,  # re-pickled: its size may or may not change
                  r"(is not the file this checkpoint wrote|has \d+ bytes, but \d+ were written)",
                  "holds no 'module' entry"),
}


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    directory = tmp_path_factory.mktemp("damage")
    hf_model().save_pretrained(directory / "hf")
    import_hf(str(directory / "hf"), str(directory / "ckpt"), TargetLayout(2, 2), make_vocab_size_divisible_by=32)
    return str(directory / "ckpt")


def damaged_copy(imported, tmp_path, case, with_manifest):
    name, damage = DAMAGES[case][:2]
    copy = str(tmp_path / "ckpt")
    shutil.copytree(imported, copy)
    step = os.path.join(copy, "global_step0")
    if not with_manifest:
        os.remove(os.path.join(step, MANIFEST_FILE))
    damage(os.path.join(step, name))
    return copy, name, DAMAGES[case][2 if with_manifest else 3]


def test_the_manifest_lists_every_file_and_a_whole_checkpoint_passes(imported):
    step = os.path.join(imported, "global_step0")
    written = {os.path.relpath(os.path.join(parent, name), step) for parent, _, names in os.walk(step)
               for name in names} - {MANIFEST_FILE}
    import json
    listed = json.load(open(os.path.join(step, MANIFEST_FILE)))["files"]
    assert set(listed) == written and len(written) > 40  # the pieces, client states and universal files
    assert manifest.check_manifest(step)
    check_checkpoint_directories(imported, None)


@pytest.mark.parametrize("with_manifest", [True, False], ids=["manifest", "layout"])
@pytest.mark.parametrize("case", DAMAGES)
def test_a_damaged_file_is_named_in_one_line(imported, tmp_path, case, with_manifest):
    copy, name, message = damaged_copy(imported, tmp_path, case, with_manifest)
    pattern = f"checkpoint file {copy}/global_step0/{name} {message}"
    for check in (lambda: read_checkpoint(copy), lambda: check_checkpoint_directories(copy, None)):
        with pytest.raises(InputError, match=pattern) as raised:
            check()
        assert "\n" not in str(raised.value)


def pretrain_outcome(argv):
    from megatron.model.provider import model_provider
    from megatron.training.loop import pretrain
    try:
        pretrain(model_provider, argv)
    except InputError as err:
        return str(err)
    except SystemExit as stopped:
        return stopped.code
    return "trained"


@pytest.mark.full
def test_the_trainer_names_a_damaged_file_on_rank_0_only(imported, tmp_path):
    copy, name, message = damaged_copy(imported, tmp_path, "missing client state", with_manifest=True)
    data = write_counting_dataset(str(tmp_path / "data"), documents=50)
    first, second = run_on_ranks(pretrain_outcome, 2, [*COMMON, "--data-path", data, "--load", copy])
    assert f"checkpoint file {copy}/global_step0/{name} is missing" in first
    assert second == 2  # stopped with the same status, without repeating the line
