"""The checkpoint layout as upstream Megatron-DeepSpeed b4d4a0e writes it (file numbering, keys, client-state types,
DeepSpeed's universal_checkpoint_info), and reading every layout a user brings: checkpoints of earlier versions
of this project and the Megatron layout that upstream's deepspeed_to_megatron.py wrote (tests/fixtures/README.md)."""
import argparse
import os
import re
import shutil

import pytest
import torch
from deepspeed.checkpoint import constants as ds

from megatron.checkpoint import parameter_names as names
from megatron.checkpoint.client_state import universal_info
from megatron.checkpoint.reshape.conversions import reshape
from megatron.checkpoint.formats.detect import Layout
from megatron.checkpoint.torch_files import load_file
from megatron.checkpoint.file_names import (CHECKPOINT_VERSION, CUDA_RNG_STATE, LATEST_ITERATION_FILE, LATEST_TAG_FILE,
                                        NP_RNG_STATE, RANDOM_RNG_STATE, RNG_TRACKER_STATES, TORCH_RNG_STATE,
                                        UNIVERSAL_CHECKPOINT_INFO)
from megatron.checkpoint.trainer.nested_module import nested_state_dict
from megatron.checkpoint.formats.optimizer_state import read_optimizer_state
from megatron.checkpoint.formats.reader import read_checkpoint
from megatron.checkpoint.trainer.resume_plan import LoadOptions, plan_resume
from megatron.checkpoint.shards import shard_of, split_dim
from megatron.checkpoint.reshape.target_writer import TargetLayout, TrainingState, write_checkpoint
from megatron.errors import InputError
from megatron.model.gpt import GPTConfig, GPTModel
from tests.helpers.paths import FIXTURES

DATA = os.path.join(FIXTURES, "checkpoints")
OLD, MEGATRON = os.path.join(DATA, "old_tp2pp2"), os.path.join(DATA, "megatron_tp1pp1")
CONFIG = GPTConfig(vocab_size=64, max_position_embeddings=16, num_layers=3, hidden_size=16, num_attention_heads=2,
                   ffn_hidden_size=32)
FLAGS = {"num_layers": 3, "hidden_size": 16, "num_attention_heads": 2, "ffn_hidden_size": 32,
         "max_position_embeddings": 16, "seq_length": 16, "hidden_dropout": 0.0, "attention_dropout": 0.0,
         "init_method_std": 0.02, "openai_gelu": False, "checkpoint_activations": False, "seed": 3,
         "tokenizer_vocab_size": 50, "zero_stage": 1, "data_parallel_size": 1}
RNG = {"python": ("state",), "numpy": ("numpy state",), "torch": torch.ByteTensor([1, 2]),
       "device": torch.ByteTensor([3])}


def model():
    return GPTModel(CONFIG).state_dict()


def write(directory, target, rng=None):
    state = TrainingState(iteration=7, consumed_train_samples=56, args=FLAGS, rng_state=rng,
                          tensor_parallel_rng_states=({"model-parallel-rng": torch.ByteTensor([4])},) * target.tensor)
    return write_checkpoint(str(directory), model(), CONFIG, state, target)


# --- what is written -------------------------------------------------------------------------------------------

def test_pipeline_files_are_numbered_and_keyed_as_upstreams(tmp_path):
    tag_dir = write(tmp_path, TargetLayout(2, 2), RNG)
    layer_files = sorted(name for name in os.listdir(tag_dir) if name.startswith("layer_"))
    # _to_float16 at 0, the embedding 01, a transpose at 02, layers 03..05, a transpose at 06, the final norm 07.
    assert layer_files == [f"layer_{n:02d}-model_{tp:02d}-model_states.pt" for n in (1, 3, 4, 5, 7) for tp in (0, 1)]
    load = lambda name: load_file(os.path.join(tag_dir, name))  # noqa: E731
    assert list(load("layer_01-model_01-model_states.pt")) == ["word_embeddings.weight", "position_embeddings.weight"]
    assert load("layer_01-model_01-model_states.pt")["word_embeddings.weight"].shape == (32, 16)  # vocab-split
    assert "self_attention.query_key_value.weight" in load("layer_04-model_00-model_states.pt")
    assert list(load("layer_07-model_00-model_states.pt")) == ["weight", "bias"]  # a bare LayerNorm
    torch.testing.assert_close(load("layer_07-model_00-model_states.pt")["weight"], model()["final_layernorm.weight"])


def test_client_state_has_upstreams_keys_and_types(tmp_path):
    tag_dir = write(tmp_path, TargetLayout(2, 2), RNG)
    state = load_file(os.path.join(tag_dir, "mp_rank_03_model_states.pt"))
    assert isinstance(state["args"], argparse.Namespace)
    args = state["args"]
    assert (args.tensor_model_parallel_size, args.pipeline_model_parallel_size, args.num_layers) == (2, 2, 3)
    assert (args.consumed_train_samples, args.padded_vocab_size) == (56, 64)
    assert state[CHECKPOINT_VERSION] == 3.0 and state["iteration"] == 7 and state["tokens"] == 56 * 16
    assert (state[RANDOM_RNG_STATE], state[NP_RNG_STATE]) == (("state",), ("numpy state",))
    assert torch.equal(state[TORCH_RNG_STATE], RNG["torch"]) and torch.equal(state[CUDA_RNG_STATE], RNG["device"])
    assert set(state[RNG_TRACKER_STATES]) == {"model-parallel-rng"}
    without_rng = load_file(os.path.join(write(tmp_path / "no-rng", TargetLayout(1, 1)), "mp_rank_00_model_states.pt"))
    assert RANDOM_RNG_STATE not in without_rng and RNG_TRACKER_STATES not in without_rng


def test_plain_engine_module_is_nested_as_upstreams_gpt_model(tmp_path):
    tag_dir = write(tmp_path, TargetLayout(2, 1, pipeline_engine=False))
    module = load_file(os.path.join(tag_dir, "mp_rank_01_model_states.pt"))["module"]
    language_model = module["language_model"]
    assert set(language_model) == {"embedding", "encoder"}
    assert set(language_model["embedding"]) == {"word_embeddings", "position_embeddings"}
    assert torch.equal(language_model["embedding"]["word_embeddings"]["weight"],
                       shard_of("embedding.word_embeddings.weight", model()["embedding.word_embeddings.weight"], 1, 2))
    assert {"layers.2.self_attention.dense.weight", "final_layernorm.bias"} <= set(language_model["encoder"])
    full = model()
    assert all(torch.equal(names.flatten(names.nest(full))[name], tensor) for name, tensor in full.items())


def test_universal_info_joins_pr_moes_dense_mlp_as_split_with_the_experts():
    # ds_to_universal must not take tensor-parallel rank 0's half of the split dense MLP beside the experts
    residual = ["layers.1.mlp.mlp.dense_h_to_4h.weight", "layers.1.mlp.mlp.dense_4h_to_h.weight",
                "layers.1.mlp.mlp.dense_4h_to_h.bias"]
    for experts, expected in ((True, [(False, False), (False, True), (True, False)]), (False, [(True, False)] * 3)):
        info = universal_info(residual, 2, False, 50, 64, experts)
        found = [tuple(any(re.match(pattern, name) for pattern in info[key]) for key in (
            ds.TP_REPLICATED_PARAMETER_PATTERNS, ds.PARAMETER_WITH_ROW_PARALLELISM_PATTERNS)) for name in residual]
        assert found == expected, experts


@pytest.mark.parametrize("pipeline_engine", [True, False])
def test_universal_info_joins_each_parameter_along_its_split_dimension(tmp_path, pipeline_engine):
    """What DeepSpeed's ds_to_universal does with each parameter, decided by the info's patterns as it decides
    (re.match, at most one per list): replicated ones are taken once, row-parallel ones joined on dim 1, the
    vocabulary cut to the tokenizer's size, the rest joined on dim 0."""
    tag_dir = write(tmp_path, TargetLayout(2, 1, pipeline_engine))
    info = load_file(os.path.join(tag_dir, "mp_rank_00_model_states.pt"))[UNIVERSAL_CHECKPOINT_INFO]
    assert (info[ds.ORIGINAL_VOCAB_SIZE], info[ds.PADDED_VOCAB_SIZE]) == (50, 64)

    def matches(key, engine_name):
        found = [pattern for pattern in info.get(key, []) if re.match(pattern, engine_name)]
        assert len(found) <= 1, (key, engine_name, found)
        return bool(found)

    for name in model():
        engine_name = names.stage_name(name, 3) if pipeline_engine else name
        replicated = matches(ds.TP_REPLICATED_PARAMETER_PATTERNS, engine_name)
        row = matches(ds.PARAMETER_WITH_ROW_PARALLELISM_PATTERNS, engine_name)
        vocabulary = matches(ds.VOCABULARY_PARAMETER_PATTERNS, engine_name)
        split = split_dim(name)
        assert (replicated, row) == (split is None, split is not None and split.dim == 1), name
        assert vocabulary == (name == "embedding.word_embeddings.weight"), name
        assert matches(ds.PIPELINE_REPLICATED_PARAMETER_PATTERNS, engine_name) == (
            pipeline_engine and name.startswith("embedding.")), name


def test_names_of_each_layout_invert():
    for name in model():
        assert names.model_name(names.stage_name(name, 3), 3) == name
        assert names.name_at_position(*names.spec_position(name, 3), 3) == name
    assert names.stage_name("layers.1.mlp.dense_h_to_4h.bias", 3) == "4.mlp.dense_h_to_4h.bias"
    assert names.stage_name("final_layernorm.weight", 3) == "7.weight"
    assert names.model_name("2.attention.dense.weight", 3, old=True) == "layers.1.self_attention.dense.weight"
    assert names.model_name("tied_modules.embedding.word_embeddings.weight", 3, old=True) == \
        "embedding.word_embeddings.weight"


def test_written_checkpoint_reads_back_with_its_optimizer_state(tmp_path):
    write(tmp_path, TargetLayout(2, 2), RNG)
    checkpoint = read_checkpoint(str(tmp_path))
    assert not checkpoint.old and checkpoint.consumed_train_samples == 56 and checkpoint.iteration == 7
    assert all(torch.equal(checkpoint.model[name], tensor) for name, tensor in model().items())


# --- what is read ----------------------------------------------------------------------------------------------

def test_earlier_versions_checkpoint_reads_as_upstreams_tool_converted_it():
    """Two real files: this project's earlier layout, and the Megatron layout upstream's deepspeed_to_megatron.py
    wrote from the same weights (trained in upstream's layout)."""
    old, megatron = read_checkpoint(OLD), read_checkpoint(MEGATRON)
    assert old.old and old.layout == Layout(2, 2, 1, 1, True)
    assert megatron.layout.megatron and megatron.layout.describe() == "Megatron layout, TP 1 x PP 1"
    assert (old.iteration, old.consumed_train_samples) == (2, 8)
    assert (megatron.iteration, megatron.consumed_train_samples) == (2, 8)
    assert list(old.model) == list(megatron.model) and len(old.model) == 28
    for name, tensor in old.model.items():
        assert torch.equal(tensor, megatron.model[name]), name


def test_earlier_versions_checkpoint_converts_with_one_command(tmp_path):
    options, run = LoadOptions(), Layout(2, 2, 1, 1, True)
    with pytest.raises(InputError, match=r"earlier version of this project.*\n.*convert_checkpoint\.py --load"):
        plan_resume(OLD, run, options, "fp32", {})
    converted = str(tmp_path / "converted")
    source = reshape(OLD, converted, TargetLayout(2, 2))
    plan = plan_resume(converted, run, options, "fp32", source.model_config.to_flags())
    assert plan.load_optimizer and plan.universal
    again = read_checkpoint(converted)
    assert not again.old and all(torch.equal(again.model[name], tensor) for name, tensor in source.model.items())
    before, after = read_optimizer_state(source), read_optimizer_state(again)
    assert before.step == after.step == 2
    for kind in ("fp32", "exp_avg", "exp_avg_sq"):
        for name, tensor in before.tensors(kind).items():
            assert torch.equal(after.tensors(kind)[name], tensor), (kind, name)


def test_megatron_layout_loads_weights_only_and_a_resume_is_refused_with_the_conversion():
    run, shape = Layout(2, 1, 2, 1, True), read_checkpoint(MEGATRON).model_config.to_flags()
    with pytest.raises(InputError, match=r"Megatron-layout checkpoint \(iter_0000002/mp_rank_\*/model_optim_rng.pt\)"
                                         r".*--finetune or --no-load-optim.*\n  .*convert_checkpoint\.py --load"):
        plan_resume(MEGATRON, run, LoadOptions(), "fp32", shape)
    plan = plan_resume(MEGATRON, run, LoadOptions(finetune=True), "fp32", shape)
    assert plan.foreign and not (plan.load_optimizer or plan.load_rng or plan.restore_progress or plan.universal)
    plan = plan_resume(OLD, Layout(1, 2, 1, 2, True), LoadOptions(no_load_optim=True), "fp32", shape)
    assert plan.foreign and plan.restore_progress and not plan.load_optimizer


def test_a_folder_with_latest_universal_only_reads_its_universal_checkpoint(tmp_path):
    """What DeepSpeed's ds_to_universal leaves: global_stepN_universal/ (zero/<engine name>/fp32.pt, vocabulary
    rows cut to the tokenizer's) and latest_universal naming it."""
    step = tmp_path / "global_step7_universal"
    tag_dir = write(tmp_path / "source", TargetLayout(2, 2))
    os.makedirs(step / "zero")
    shutil.copy(os.path.join(tag_dir, "mp_rank_00_model_states.pt"), step)
    for name, tensor in model().items():
        folder = step / "zero" / names.stage_name(name, 3)
        folder.mkdir()
        torch.save({"param": tensor[:50] if name == names.WORD_EMBEDDINGS else tensor}, folder / "fp32.pt")
    (tmp_path / "latest_universal").write_text(step.name)
    checkpoint = read_checkpoint(str(tmp_path))
    assert checkpoint.directory == str(step) and checkpoint.layout.universal
    for name, tensor in model().items():
        expected = torch.cat([tensor[:50], torch.zeros(14, 16)]) if name == names.WORD_EMBEDDINGS else tensor
        assert torch.equal(checkpoint.model[name], expected), name


def test_megatron_release_and_bad_pointer(tmp_path):
    release = tmp_path / "release_ckpt"
    shutil.copytree(MEGATRON, release)
    os.rename(release / "iter_0000002", release / "release")
    (release / LATEST_ITERATION_FILE).write_text("release")
    assert read_checkpoint(str(release)).directory.endswith("release")
    (release / LATEST_ITERATION_FILE).write_text("soon")
    with pytest.raises(InputError, match=r"latest_checkpointed_iteration.txt holds 'soon', neither an iteration"):
        read_checkpoint(str(release))


def test_an_unknown_layout_is_named_in_one_line(tmp_path):
    step = tmp_path / "global_step5"
    step.mkdir()
    (step / "weights.bin").write_bytes(b"x")
    (tmp_path / LATEST_TAG_FILE).write_text("global_step5")
    with pytest.raises(InputError, match=r"global_step5 holds no mp_rank_00_model_states.pt .* it holds weights.bin, "
                                         r"which is no checkpoint layout this trainer reads") as error:
        read_checkpoint(str(tmp_path))
    assert "\n" not in str(error.value)


def test_a_plain_engine_module_nests_its_state_dict_while_saving_only():
    """What DeepSpeed saves as a plain engine's `module` (the module's state_dict) is upstream's nesting within
    nested_state_dict, the flat dict again after; a part of the model asked on its own keeps its names."""
    gpt = GPTModel(CONFIG)
    flat = gpt.state_dict()
    with nested_state_dict(gpt):
        nested = gpt.state_dict()
        layer = gpt.layers[0].state_dict()
    assert list(nested) == ["language_model"] and names.flatten(nested).keys() == flat.keys()
    assert all(torch.equal(names.flatten(nested)[name], tensor) for name, tensor in flat.items())
    assert set(layer) == {name[len("layers.0."):] for name in flat if name.startswith("layers.0.")}
    assert gpt.state_dict().keys() == flat.keys()
