"""A checkpoint is data: a real tiny checkpoint with an object planted in one of its files (its manifest
rewritten to match) whose unpickling would create a marker file (as `os.system` would run a command) is refused
by every entry point that reads checkpoints, in one line naming the file and the type, and the marker never
appears. --trust-checkpoint io.open lets such a file load (it then builds what the user named)."""
import os
import re
import shutil

import pytest
import torch
from tests.helpers.distributed import run_on_ranks
from tests.helpers.training import COMMON, write_counting_dataset

from megatron.checkpoint import trust
from megatron.checkpoint.torch_files import load_file
from megatron.checkpoint.manifest import write_manifest
from megatron.errors import InputError, run_cli

pytestmark = pytest.mark.full  # a training run makes the checkpoint

CLIENT_STATE = "mp_rank_00_model_states.pt"
OPTIMIZER_STATE = "zero_pp_rank_0_mp_rank_00_optim_states.pt"
REFUSAL = r"checkpoint file .*{name} holds io.open, which a checkpoint may not hold .* --trust-checkpoint"


class Planted:
    """Unpickled, it calls open(marker, 'w'): any code could run in its place."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return open, (self.marker, "w")


def pretrain_only(argv):
    from megatron.model.provider import model_provider
    from megatron.training.loop import pretrain
    pretrain(model_provider, argv)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    directory = tmp_path_factory.mktemp("trust")
    data = write_counting_dataset(str(directory / "counting_text_document"))
    flags = [*COMMON, "--data-path", data, "--zero-stage", "1"]
    run_on_ranks(pretrain_only, 1, [*flags, "--save", str(directory / "clean"), "--save-interval", "5"])
    return directory, flags


def planted_copy(trained, tmp_path, name):
    """A copy of the checkpoint whose file `name` also holds a Planted object; returns (directory, marker)."""
    directory, _ = trained
    copy, marker = str(tmp_path / "ckpt"), str(tmp_path / "MARKER")
    shutil.copytree(directory / "clean", copy, symlinks=True)
    path = os.path.join(copy, "global_step5", name)
    state = torch.load(path, weights_only=False)
    state["planted"] = Planted(marker)
    torch.save(state, path)
    write_manifest(os.path.dirname(path))  # as whoever planted it would
    return copy, marker


def test_every_file_we_write_loads_as_data(trained):
    directory, _ = trained
    step = directory / "clean" / "global_step5"
    names = [name for name in os.listdir(step) if name.endswith(".pt")]
    assert len(names) == 6  # client state, 4 pipeline pieces, ZeRO-1 partition
    for name in names:
        assert trust.unsafe_type(str(step / name)) is None, name
        load_file(str(step / name))


@pytest.mark.parametrize("tool", ["inspect", "reshape", "to-hf", "generate", "zeroshot"])
def test_tools_refuse_a_planted_object_in_one_line(trained, tmp_path, capsys, tool):
    from tasks.zeroshot_gpt.evaluate import main as zeroshot
    from tools.convert_checkpoint import main as convert
    from tools.generate_text import main as generate
    from tools.inspect_checkpoint import main as inspect

    checkpoint, marker = planted_copy(trained, tmp_path, CLIENT_STATE)
    (tmp_path / "wiki.txt").write_text("1 2 3 4 5 6\n")
    main, argv = {
        "inspect": (inspect, [checkpoint]),
        "reshape": (convert, ["--load", checkpoint, "--save", str(tmp_path / "out")]),
        "to-hf": (convert, ["--load", checkpoint, "--to-hf", str(tmp_path / "hf")]),
        "generate": (generate, ["--load", checkpoint, "--prompt", "1 2 3", "--max-new-tokens", "2"]),
        "zeroshot": (zeroshot, ["--load", checkpoint, "--task", "WIKITEXT103", "--valid-data",
                                str(tmp_path / "wiki.txt")])}[tool]
    with pytest.raises(SystemExit) as stopped:
        run_cli(main, argv)
    assert stopped.value.code == 2
    output = capsys.readouterr().err
    error = output.strip().splitlines()[-1]  # after the tools' progress lines
    assert error.startswith("error: ") and "Traceback" not in output
    assert re.search(REFUSAL.format(name=CLIENT_STATE), error), error
    assert not os.path.exists(marker)


def test_reshape_refuses_a_planted_optimizer_file(trained, tmp_path):
    from tools.convert_checkpoint import main as convert

    checkpoint, marker = planted_copy(trained, tmp_path, OPTIMIZER_STATE)
    with pytest.raises(InputError, match=REFUSAL.format(name=OPTIMIZER_STATE)):
        convert(["--load", checkpoint, "--save", str(tmp_path / "out")])
    assert not os.path.exists(marker)


@pytest.mark.parametrize("name", [CLIENT_STATE, OPTIMIZER_STATE])
def test_training_with_load_refuses_a_planted_object(trained, tmp_path, name):
    _, flags = trained
    checkpoint, marker = planted_copy(trained, tmp_path, name)
    with pytest.raises(AssertionError, match=REFUSAL.format(name=name)):
        run_on_ranks(pretrain_only, 1, [*flags, "--load", checkpoint, "--train-iters", "6"])
    assert not os.path.exists(marker)


def test_deepspeeds_own_loader_follows_the_rule(trained, tmp_path):
    from deepspeed.runtime.checkpoint_engine import TorchCheckpointEngine

    checkpoint, marker = planted_copy(trained, tmp_path, OPTIMIZER_STATE)
    path = os.path.join(checkpoint, "global_step5", OPTIMIZER_STATE)
    with trust.deepspeed_loads(), pytest.raises(Exception, match="io.open"):
        TorchCheckpointEngine().load(path, map_location="cpu")
    assert not os.path.exists(marker)
    assert "TORCH_FORCE_WEIGHTS_ONLY_LOAD" not in os.environ  # the switch lasts for the load only
    TorchCheckpointEngine().load(path, map_location="cpu")  # outside the scope DeepSpeed unpickles anything
    assert os.path.exists(marker)


def test_trust_checkpoint_loads_an_old_or_foreign_file(trained, tmp_path):
    from tools.inspect_checkpoint import main as inspect

    checkpoint, marker = planted_copy(trained, tmp_path, CLIENT_STATE)
    assert inspect([checkpoint, "--trust-checkpoint", "io.open"]) == 0
    assert os.path.exists(marker)  # what the flag allows: the file's code ran
