"""formats/detect.weights_kind: every source layout is recognised once, from its files and client state, as the
kind of weights the reader then looks up; the files a layout needs follow from that kind."""
import os
import shutil

import pytest

from tools.fixtures.checkpoint_sources import write_megatron, write_zero3
from megatron.checkpoint.reshape.target_writer import TargetLayout, TrainingState, write_checkpoint
from megatron.checkpoint.file_names import UNIVERSAL_DIR, layer_file
from megatron.checkpoint.formats import detect
from megatron.checkpoint.formats.locate import checkpoint_directory
from megatron.checkpoint.formats.reader import WEIGHT_UNITS, read_checkpoint
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


def test_swiglu_checkpoints_whose_gate_and_up_are_per_rank_halves_are_refused(tmp_path):
    """Ours ([ffn, (gate, up)] interleaved) reads; upstream main's, whose client state lists dense_h_to_4h among
    DeepSpeed's PARAMETER_WITH_2_SUB_PARAMS_CAT_DIM_0, and Megatron's layout are refused in one line rather than
    read with gate and up mixed."""
    from deepspeed.checkpoint import constants as ds
    from megatron.checkpoint.file_names import MANIFEST_FILE, model_states_file
    from megatron.checkpoint.torch_files import load_file, replace
    from megatron.errors import InputError

    config = GPTConfig(**{**vars(CONFIG), "swiglu": True})
    flags = {**FLAGS, "swiglu": True}
    write_checkpoint(str(tmp_path / "ours"), GPTModel(config).state_dict(), config, TrainingState(3, 24, flags),
                     TargetLayout(1, 1, pipeline_engine=False))
    assert kind_of(str(tmp_path / "ours")) == detect.PLAIN
    upstream = tmp_path / "upstream"
    shutil.copytree(tmp_path / "ours", upstream)
    tag_dir = checkpoint_directory(str(upstream))
    os.remove(os.path.join(tag_dir, MANIFEST_FILE))  # upstream writes none
    path = os.path.join(tag_dir, model_states_file(0, 0))
    state = load_file(path, mmap=False)
    state["universal_checkpoint_info"][ds.PARAMETER_WITH_2_SUB_PARAMS_CAT_DIM_0] = [r"layers\.\d+\.mlp\.dense_h_to_4h"]
    replace(path, state)
    with pytest.raises(InputError, match=r"\[gate; up\] halves .*hf2megads_weight_converter.py --to-hf-ckpt"):
        kind_of(str(upstream))
    write_megatron(str(tmp_path / "megatron"), GPTModel(config).state_dict(), flags, tensor=1, pipeline=1,
                   iteration=3)
    with pytest.raises(InputError, match="Megatron's layout"):
        kind_of(str(tmp_path / "megatron"))
