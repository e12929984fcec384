"""formats/detect.weights_kind: every source layout is recognised once, from its files and client state, as the
kind of weights the reader then looks up; the files a layout needs follow from that kind."""
import os
import shutil

import pytest
import torch

from tools.fixtures.checkpoint_sources import write_megatron, write_zero3
from megatron.checkpoint.reshape.target_writer import TargetLayout, TrainingState, write_checkpoint
from megatron.checkpoint.file_names import UNIVERSAL_DIR, layer_file
from megatron.checkpoint.formats import detect
from megatron.checkpoint.formats.locate import checkpoint_directory
from megatron.checkpoint.formats.reader import WEIGHT_UNITS, read_checkpoint
from megatron.checkpoint.formats.weight_units import TensorShard
from megatron.model.gpt import GPTConfig, GPTModel
from tests.helpers.paths import FIXTURES

CONFIG = GPTConfig(vocab_size=64, max_position_embeddings=16, num_layers=2, hidden_size=16, num_attention_heads=2,
                   ffn_hidden_size=32)
FLAGS = {"num_layers": 2, "hidden_size": 16, "num_attention_heads": 2, "ffn_hidden_size": 32,
         "max_position_embeddings": 16, "seq_length": 16, "seed": 3, "tokenizer_vocab_size": 50}
DATA = os.path.join(FIXTURES, "checkpoints")


def kind_of(load_dir: str) -> str:
    tag_dir = checkpoint_directory(load_dir)
    state = detect.read_client_state(tag_dir)
    return detect.weights_kind(tag_dir, state, detect.layout_of(state, tag_dir))


def written(directory, target: TargetLayout) -> str:
    write_checkpoint(str(directory), GPTModel(CONFIG).state_dict(), CONFIG, TrainingState(3, 24, FLAGS), target)
    return str(directory)


def test_every_kind_has_one_reader():
    assert sorted(WEIGHT_UNITS) == sorted(detect.KINDS)


def test_the_engines_files_are_told_apart(tmp_path):
    assert kind_of(written(tmp_path / "pipe", TargetLayout(2, 2))) == detect.PIPELINE
    assert kind_of(written(tmp_path / "plain", TargetLayout(2, 1, pipeline_engine=False))) == detect.PLAIN


def test_zero3_and_megatron_sources(tmp_path):
    weights = GPTModel(CONFIG).state_dict()
    write_zero3(str(tmp_path / "zero3"), weights, FLAGS, tensor=1, data=2, iteration=3)
    write_megatron(str(tmp_path / "megatron"), weights, FLAGS, tensor=1, pipeline=2, iteration=3)
    assert kind_of(str(tmp_path / "zero3")) == detect.ZERO3
    assert kind_of(str(tmp_path / "megatron")) == detect.MEGATRON


def test_checkpoints_of_other_writers_on_disk():
    assert kind_of(os.path.join(DATA, "old_tp2pp2")) == detect.PIPELINE_FROM_ZERO
    assert kind_of(os.path.join(DATA, "megatron_tp1pp1")) == detect.MEGATRON


def test_a_pipeline_checkpoint_without_layer_files_but_per_parameter_files_is_read_from_those(tmp_path):
    """As DeepSpeed's ds_to_universal leaves it: the model-states files beside zero/, no layer files."""
    source = written(tmp_path / "src", TargetLayout(1, 1))
    tag_dir = checkpoint_directory(source)
    whole = read_checkpoint(source).model
    for name in os.listdir(tag_dir):
        if name.startswith("layer_"):
            os.remove(os.path.join(tag_dir, name))
    os.remove(os.path.join(tag_dir, "manifest.json"))
    assert os.path.isdir(os.path.join(tag_dir, UNIVERSAL_DIR))
    assert kind_of(source) == detect.UNIVERSAL_FILES
    assert detect.layout_files(detect.read_client_state(tag_dir, verify=False), tag_dir) == {
        "mp_rank_00_model_states.pt": "module"}
    read = read_checkpoint(source).model
    assert sorted(read) == sorted(whole)


@pytest.mark.parametrize("kind, first", [(detect.PIPELINE, 1), (detect.PIPELINE_FROM_ZERO, 0)])
def test_the_layer_files_a_pipeline_kind_needs(tmp_path, kind, first):
    source = written(tmp_path / "src", TargetLayout(1, 1))
    tag_dir = checkpoint_directory(source)
    state = detect.read_client_state(tag_dir)
    if kind == detect.PIPELINE_FROM_ZERO:  # numbered as earlier versions of this project numbered them
        shutil.copy(os.path.join(tag_dir, layer_file(1, 0)), os.path.join(tag_dir, layer_file(0, 0)))
    files = detect.layout_files(state, tag_dir)
    layers = sorted(int(name[len("layer_"):].split("-")[0]) for name in files if name.startswith("layer_"))
    assert layers[0] == first and len(layers) == CONFIG.num_layers + 2


def test_swiglu_rows_read_as_halves_from_upstream_and_ours_and_older_interleaved_ones_converted_at_load(tmp_path):
    """Ours now: each rank's [gate_r; up_r] (our args and DeepSpeed's universal info say so), as upstream main's
    and Megatron's layout: read as they are. A checkpoint of this project from before (a plain split of
    [ffn, (gate, up)] interleaved rows, neither mark) is told apart and its rows put in halves once, at load."""
    from deepspeed.checkpoint import constants as ds
    from megatron.checkpoint.file_names import GATE_UP_ROWS, MANIFEST_FILE, model_states_file
    from megatron.checkpoint.parameter_names import flatten, nest
    from megatron.checkpoint.shards import HALVES, INTERLEAVED
    from megatron.checkpoint.torch_files import load_file, replace
    from megatron.checkpoint.trainer.resume_plan import LoadOptions, plan_resume
    from megatron.errors import InputError

    config = GPTConfig(**{**vars(CONFIG), "swiglu": True})
    weights = GPTModel(config).state_dict()
    flags = {**FLAGS, "swiglu": True}
    write_checkpoint(str(tmp_path / "ours"), weights, config, TrainingState(3, 24, flags),
                     TargetLayout(2, 1, pipeline_engine=False))
    write_megatron(str(tmp_path / "megatron"), weights, flags, tensor=2, pipeline=1, iteration=3)
    rows = "layers.1.mlp.dense_h_to_4h.weight"
    for source in ("ours", "megatron"):
        tag_dir = checkpoint_directory(str(tmp_path / source))
        assert detect.gate_up_rows(tag_dir, detect.read_client_state(tag_dir)) == HALVES
        assert torch.equal(read_checkpoint(str(tmp_path / source)).model[rows], weights[rows]), source
    state = detect.read_client_state(checkpoint_directory(str(tmp_path / "ours")))
    gate, up = weights[rows].chunk(2)
    first_rank = flatten(load_file(os.path.join(checkpoint_directory(str(tmp_path / "ours")),
                                                model_states_file(0, 0)))["module"])[rows]
    assert torch.equal(first_rank, torch.cat((gate.chunk(2)[0], up.chunk(2)[0])))  # upstream's [gate_0; up_0]
    assert state["args"][GATE_UP_ROWS] == HALVES
    assert state["universal_checkpoint_info"][ds.PARAMETER_WITH_2_SUB_PARAMS_CAT_DIM_0]

    older = tmp_path / "older"
    shutil.copytree(tmp_path / "ours", older)
    tag_dir = checkpoint_directory(str(older))
    os.remove(os.path.join(tag_dir, MANIFEST_FILE))
    interleaved = torch.stack((gate, up), dim=1).flatten(0, 1)
    for tp in range(2):
        path = os.path.join(tag_dir, model_states_file(tp, 0))
        contents = load_file(path, mmap=False)
        module = flatten(contents["module"])
        module[rows] = interleaved.chunk(2)[tp].clone()
        args = vars(contents["args"])
        del args[GATE_UP_ROWS]
        del contents["universal_checkpoint_info"][ds.PARAMETER_WITH_2_SUB_PARAMS_CAT_DIM_0]
        replace(path, {**contents, "module": nest(module)})
    assert detect.gate_up_rows(tag_dir, detect.read_client_state(tag_dir)) == INTERLEAVED
    assert torch.equal(read_checkpoint(str(older)).model[rows], weights[rows])
    for rank in range(2):
        halves = read_checkpoint(str(older), part=TensorShard(rank, 2)).model[rows]
        assert torch.equal(halves, torch.cat((gate.chunk(2)[rank], up.chunk(2)[rank]))), rank
    # The trainer: DeepSpeed's engine would load its per-rank rows as they are, so it copies the weights in through
    # the reader, or (with the optimizer state) says how to convert it once.
    run, model_flags = detect.Layout(2, 1, 1, 0, False), read_checkpoint(str(older)).model_config.to_flags()
    with pytest.raises(InputError, match=r"interleaved .*convert it once with\n.*convert_checkpoint.py --load"):
        plan_resume(str(older), run, LoadOptions(), "fp32", model_flags)
    assert plan_resume(str(older), run, LoadOptions(finetune=True), "fp32", model_flags).foreign
