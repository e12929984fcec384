"""Reshaping reads a source one model piece at a time (weight_units.StreamedWeights), whatever its layout (pipeline
engine, plain engine, ZeRO 3, Megatron; a legacy-format file whole), and a universal checkpoint's Adam state one
file at a time, and still writes byte for byte the files the writer makes from the
whole model and Adam state in memory (what reshape did before). The Adam state's files are parsed once each."""
import collections
import contextlib
import os
import sys
import weakref

import pytest
import torch

from megatron.checkpoint.reshape.conversions import reshape, training_state
from megatron.checkpoint import trust
from tools.fixtures.checkpoint_sources import write_megatron, write_zero0, write_zero12, write_zero3
from megatron.checkpoint.parameter_names import spec_position
from megatron.checkpoint.formats.checkpoint import OptimizerState
from megatron.checkpoint.formats.optimizer_state import read_optimizer_state
from megatron.config.recorded_flags import RecordedFlags
from megatron.checkpoint.formats.reader import read_checkpoint
from megatron.checkpoint.formats.weight_units import StreamedWeights, Units, names_in
from megatron.checkpoint.reshape.target_writer import TargetLayout, TrainingState, write_checkpoint
from megatron.model.gpt import GPTConfig, GPTModel
from megatron.model.gpt_config import gpt_config
from tests.helpers.paths import FIXTURES

CONFIG = GPTConfig(vocab_size=64, max_position_embeddings=16, num_layers=3, hidden_size=16, num_attention_heads=2,
                   ffn_hidden_size=32)
FLAGS = {"num_layers": 3, "hidden_size": 16, "num_attention_heads": 2, "ffn_hidden_size": 32,
         "max_position_embeddings": 16, "seq_length": 16, "seed": 3, "tokenizer_vocab_size": 50}


def source(directory, with_adam: bool) -> tuple:
    """A TP2 x PP2 pipeline-engine checkpoint, with Adam state when `with_adam`; its directory and that state."""
    weights = GPTModel(CONFIG).state_dict()
    generator = torch.Generator().manual_seed(0)
    moment = lambda: {name: torch.rand(w.shape, generator=generator) for name, w in weights.items()}  # noqa: E731
    adam = OptimizerState(step=5, fp32={name: w.float() for name, w in weights.items()}, exp_avg=moment(),
                          # a universal keeps none
                          exp_avg_sq=moment(), param_groups=RecordedFlags.of(FLAGS).adam_param_groups)
    write_checkpoint(str(directory), weights, CONFIG, TrainingState(7, 56, FLAGS), TargetLayout(2, 2),
                     adam if with_adam else None)
    return str(directory), adam if with_adam else None


def files(directory: str) -> dict:
    found = {}
    for root, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as handle:
                found[os.path.relpath(path, directory)] = handle.read()
    return found


def test_streamed_weights_are_the_tensors_read_at_once_in_the_same_order(tmp_path):
    src, _ = source(tmp_path / "src", with_adam=False)
    streamed, whole = read_checkpoint(src, streamed=True).model, read_checkpoint(src).model
    assert list(streamed) == list(whole) and len(streamed) == len(whole)
    for name in reversed(list(whole)):  # any order: each piece is read again when asked for
        assert torch.equal(streamed[name], whole[name]), name


@pytest.mark.parametrize("with_adam", [False, True])
@pytest.mark.parametrize("target", [TargetLayout(1, 1), TargetLayout(1, 1, pipeline_engine=False),
                                    TargetLayout(2, 3)])
def test_reshape_writes_what_the_writer_makes_of_the_whole_model(tmp_path, target, with_adam):
    src, adam = source(tmp_path / "src", with_adam)
    reshape(src, str(tmp_path / "streamed"), target)
    whole = read_checkpoint(src)  # the Adam state: as the source was written from it, in memory
    write_checkpoint(str(tmp_path / "whole"), whole.model, gpt_config(whole.model_config, whole.padded_vocab_size),
                     training_state(whole), target, adam)
    streamed, expected = files(str(tmp_path / "streamed")), files(str(tmp_path / "whole"))
    assert sorted(streamed) == sorted(expected)
    assert [name for name in expected if streamed[name] != expected[name]] == []


def test_universal_adam_state_reads_as_it_was_written(tmp_path):
    src, adam = source(tmp_path / "src", with_adam=True)
    read = read_optimizer_state(read_checkpoint(src, streamed=True))
    assert read.step == adam.step
    for kind in ("fp32", "exp_avg", "exp_avg_sq"):
        assert list(read.tensors(kind)) == list(adam.tensors(kind))
        for name, tensor in adam.tensors(kind).items():
            assert torch.equal(read.tensors(kind)[name], tensor), (kind, name)


# ----------------------------------------------------------------------------- the other source layouts

def stage_of(name: str) -> int:
    """Where the Megatron source at PP2 keeps `name`: the embedding and layers 0-1 on stage 0, the rest on 1."""
    return 0 if name.startswith("embedding.") or name.split(".")[:2] in (["layers", "0"], ["layers", "1"]) else 1


def megatron_source(directory, weights: dict, legacy: bool) -> str:
    write_megatron(str(directory), weights, FLAGS, tensor=2, pipeline=2, iteration=7, legacy=legacy)
    return str(directory)


def zero3_source(directory, weights: dict, legacy: bool = False, adam=None) -> str:
    write_zero3(str(directory), weights, FLAGS, tensor=2, data=2, iteration=7, adam=adam, legacy=legacy)
    return str(directory)


def plain_engine_source(directory, weights: dict, legacy: bool = False) -> str:
    """TP2 on the plain engine, as the writer makes it (the module nested as upstream's in each mp_rank file)."""
    write_checkpoint(str(directory), weights, CONFIG, TrainingState(7, 56, FLAGS),
                     TargetLayout(2, 1, pipeline_engine=False))
    return str(directory)


SOURCES = {"megatron": lambda directory, weights: megatron_source(directory, weights, legacy=False),
           "megatron-legacy-format": lambda directory, weights: megatron_source(directory, weights, legacy=True),
           "zero3": zero3_source, "zero3-legacy-format": lambda d, w: zero3_source(d, w, legacy=True),
           "plain-engine": plain_engine_source}


@pytest.mark.parametrize("kind", sorted(SOURCES))
def test_each_layout_streams_the_weights_it_reads_whole(tmp_path, kind):
    weights = GPTModel(CONFIG).state_dict()
    src = SOURCES[kind](tmp_path / "src", weights)
    streamed, whole = read_checkpoint(src, streamed=True).model, read_checkpoint(src).model
    assert list(streamed) == list(whole) and sorted(whole) == sorted(weights)  # ZeRO 3: in its groups' order
    alive = {}
    for name in whole:
        assert torch.equal(streamed[name], weights[name]) and torch.equal(whole[name], weights[name]), name
        alive[name] = weakref.ref(streamed[name])
    kept = sorted(name for name, ref in alive.items() if ref() is not None)
    if "legacy" in kind:  # a legacy file cannot be memory-mapped: its whole file set is one unit (a stage's)
        assert kept == sorted(name for name in weights if kind.startswith("zero3") or stage_of(name) == 1)
    else:  # memory-mapped: one model piece at a time, the last one kept
        assert kept == sorted(name for name in weights if name.startswith("final_layernorm."))


@pytest.mark.parametrize("kind", ["megatron", "zero3", "plain-engine"])
@pytest.mark.parametrize("target", [TargetLayout(1, 1), TargetLayout(1, 2)])
def test_reshaping_each_layout_writes_what_the_writer_makes_of_the_whole_model(tmp_path, kind, target):
    weights = GPTModel(CONFIG).state_dict()
    src = SOURCES[kind](tmp_path / "src", weights)
    reshape(src, str(tmp_path / "streamed"), target, weights_only=True)
    source = read_checkpoint(src)  # its names' order (ZeRO 3: its groups'), the values made above
    write_checkpoint(str(tmp_path / "whole"), {name: weights[name] for name in source.model}, CONFIG,
                     training_state(source), target)
    streamed, expected = files(str(tmp_path / "streamed")), files(str(tmp_path / "whole"))
    assert sorted(streamed) == sorted(expected)
    assert [name for name in expected if streamed[name] != expected[name]] == []


def test_zero3_adam_state_streams_and_reshapes_byte_for_byte(tmp_path):
    weights = GPTModel(CONFIG).state_dict()
    generator = torch.Generator().manual_seed(1)
    moment = lambda: {name: torch.rand(w.shape, generator=generator) for name, w in weights.items()}  # noqa: E731
    adam = OptimizerState(step=5, fp32=weights, exp_avg=moment(), exp_avg_sq=moment(),
                          param_groups=RecordedFlags.of(FLAGS).adam_param_groups)
    src = zero3_source(tmp_path / "src", weights, adam=adam)
    read = read_optimizer_state(read_checkpoint(src, streamed=True))
    assert read.step == 5 and [group["weight_decay"] for group in read.param_groups] == [0.01, 0.0]
    for kind in ("fp32", "exp_avg", "exp_avg_sq"):
        assert sorted(read.tensors(kind)) == sorted(weights)
        for name in read.tensors(kind):
            assert torch.equal(read.tensors(kind)[name], adam.tensors(kind)[name]), (kind, name)
    target = TargetLayout(1, 2)
    reshape(src, str(tmp_path / "streamed"), target)
    source = read_checkpoint(src)
    in_order = lambda tensors: {name: tensors[name] for name in source.model}  # noqa: E731
    kinds = {kind: in_order(adam.tensors(kind)) for kind in ("fp32", "exp_avg", "exp_avg_sq")}
    write_checkpoint(str(tmp_path / "whole"), in_order(weights), CONFIG, training_state(source), target,
                     OptimizerState(step=5, param_groups=read.param_groups, **kinds))
    streamed, expected = files(str(tmp_path / "streamed")), files(str(tmp_path / "whole"))
    assert sorted(streamed) == sorted(expected)
    assert [name for name in expected if streamed[name] != expected[name]] == []


# ----------------------------------------------------------------------------- one read of each piece

@pytest.mark.parametrize("target", [TargetLayout(1, 1), TargetLayout(2, 2), TargetLayout(1, 1, pipeline_engine=False)])
def test_the_writer_reads_each_source_piece_once(tmp_path, target):
    """The model files and the universal files of a piece are written while it is held (universal_files), so a
    streamed source is read once, and the files are those the whole model in memory makes."""
    weights = GPTModel(CONFIG).state_dict()
    of = {name: spec_position(name, CONFIG.num_layers)[0] for name in weights}
    reads = []

    def read(unit):
        reads.append(unit)
        return {name: weights[name].clone() for name in names_in(of, unit)}
    state = TrainingState(7, 56, FLAGS)
    write_checkpoint(str(tmp_path / "streamed"), StreamedWeights(Units(of, read)), CONFIG, state, target)
    write_checkpoint(str(tmp_path / "whole"), weights, CONFIG, state, target)
    assert sorted(reads) == sorted(set(of.values()))
    streamed, expected = files(str(tmp_path / "streamed")), files(str(tmp_path / "whole"))
    assert sorted(streamed) == sorted(expected)
    assert [name for name in expected if streamed[name] != expected[name]] == []


# ----------------------------------------------------------------------------- one parse of each Adam-state file

@contextlib.contextmanager
def parses(directory: str):
    """Counts, by path under `directory`, the checkpoint files parsed meanwhile: every read of one goes through
    trust.torch_load (torch.load whole, memory-mapped or on the meta device), whose calls a profile function sees."""
    counts = collections.Counter()
    code, previous = trust.torch_load.__code__, sys.getprofile()

    def profile(frame, event, _arg):
        if event == "call" and frame.f_code is code:
            counts[os.path.relpath(frame.f_locals["path"], directory)] += 1
    sys.setprofile(profile)
    try:
        yield counts
    finally:
        sys.setprofile(previous)


def adam(weights: dict) -> OptimizerState:
    generator = torch.Generator().manual_seed(2)
    moment = lambda: {name: torch.rand(w.shape, generator=generator) for name, w in weights.items()}  # noqa: E731
    return OptimizerState(step=5, fp32={name: w.float() for name, w in weights.items()}, exp_avg=moment(),
                          exp_avg_sq=moment(), param_groups=RecordedFlags.of(FLAGS).adam_param_groups)


OLD = os.path.join(FIXTURES, "checkpoints", "old_tp2pp2")


def adam_source(kind: str, directory: str) -> str:
    """A TP2 source with Adam state in layout `kind` (ADAM_SOURCES); its directory."""
    weights, state = GPTModel(CONFIG).state_dict(), TrainingState(7, 56, FLAGS)
    if kind == "zero1-pipeline (DeepSpeed's)":
        return OLD  # TP2 x PP2, written by DeepSpeed
    if kind == "zero0-pipeline":
        write_zero0(directory, weights, CONFIG, state, TargetLayout(2, 2), adam(weights))
    elif kind == "zero1-plain":
        write_zero12(directory, weights, adam(weights), FLAGS, tensor=2, data=2, iteration=7)
    elif kind == "zero3":
        write_zero3(directory, weights, FLAGS, tensor=2, data=2, iteration=7, adam=adam(weights))
    else:
        write_checkpoint(directory, weights, CONFIG, state, TargetLayout(2, 2), adam(weights))
    return directory


# layout -> how the files holding its Adam state are named
ADAM_SOURCES = {"zero0-pipeline": "mp_rank_", "zero1-pipeline (DeepSpeed's)": "_optim_states.pt",
                "zero1-plain": "_optim_states.pt", "zero3": "_optim_states.pt", "universal": "exp_avg_sq.pt"}


@pytest.mark.parametrize("kind", ["zero0-pipeline", "zero1-plain"])
def test_the_written_zero_sources_read_as_the_state_they_were_made_from(tmp_path, kind):
    src, weights = adam_source(kind, str(tmp_path / "src")), GPTModel(CONFIG).state_dict()
    source = read_checkpoint(src, streamed=True)
    read, made = read_optimizer_state(source), adam(weights)
    assert source.layout.zero_stage == int(kind[4]) and read.step == made.step
    for name in weights:
        assert torch.equal(source.model[name], weights[name]), name
        for state in ("fp32", "exp_avg", "exp_avg_sq"):
            assert torch.equal(read.tensors(state)[name], made.tensors(state)[name]), (state, name)


@pytest.mark.parametrize("kind", sorted(ADAM_SOURCES))
def test_reshaping_with_the_adam_state_parses_each_of_its_files_once_more_than_without(tmp_path, kind):
    """Each piece of each kind (master weights, both moments) comes from files parsed once for all of them:
    reshaping with the Adam state parses no file more than once beyond what a weights-only reshape parses."""
    src, adam_file = adam_source(kind, str(tmp_path / "src")), ADAM_SOURCES[kind]
    with parses(src) as weights_only:
        reshape(src, str(tmp_path / "weights"), TargetLayout(1, 1), weights_only=True)
    with parses(src) as with_adam:
        reshape(src, str(tmp_path / "adam"), TargetLayout(1, 1))
    added = with_adam - weights_only
    adam_files = {path for path in with_adam if adam_file in path}
    assert len(adam_files) >= 4 and adam_files <= set(added)
    assert {path: count for path, count in added.items() if count != 1} == {}
