"""Reshaping reads a pipeline-engine source one piece at a time (reader.StreamedWeights) and a universal
checkpoint's Adam state one file at a time, and still writes byte for byte the files the writer makes from the
whole model and Adam state in memory (what reshape did before)."""
import os

import pytest
import torch

from megatron.checkpoint.convert import reshape, training_state
from megatron.checkpoint.optimizer_state import OptimizerState, default_param_groups, read_optimizer_state
from megatron.checkpoint.reader import read_checkpoint
from megatron.checkpoint.writer import TargetLayout, TrainingState, write_checkpoint
from megatron.model.gpt import GPTConfig, GPTModel
from megatron.model.gpt_config import gpt_config

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
                          exp_avg_sq=moment(), param_groups=default_param_groups(FLAGS))  # a universal keeps none
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
