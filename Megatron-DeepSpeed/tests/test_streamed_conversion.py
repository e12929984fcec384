"""Reshaping reads a source one model piece at a time (reader.StreamedWeights), whatever its layout (pipeline
engine, plain engine, ZeRO 3, Megatron; a legacy-format file whole), and a universal checkpoint's Adam state one
file at a time, and still writes byte for byte the files the writer makes from the
whole model and Adam state in memory (what reshape did before)."""
import argparse
import os
import weakref

import pytest
import torch

from megatron.checkpoint.convert import reshape, training_state
from megatron.checkpoint.layout import (LATEST_ITERATION_FILE, LATEST_TAG_FILE, MEGATRON_FILE, megatron_iteration_dir,
                                        megatron_rank_dir, model_states_file, optimizer_states_file)
from megatron.checkpoint.names import nest
from megatron.checkpoint.optimizer_state import OptimizerState, default_param_groups, read_optimizer_state
from megatron.checkpoint.reader import read_checkpoint
from megatron.checkpoint.shards import shard_of
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


# ----------------------------------------------------------------------------- the other source layouts

def stage_of(name: str) -> int:
    """Where the Megatron source below keeps `name`: the embedding and layers 0-1 on stage 0, the rest on 1."""
    return 0 if name.startswith("embedding.") or name.split(".")[:2] in (["layers", "0"], ["layers", "1"]) else 1


def megatron_source(directory, weights: dict, legacy: bool) -> str:
    """TP2 x PP2 in Megatron's layout (iter_N/mp_rank_XX_YYY/model_optim_rng.pt, each stage numbering its layers
    from 0), in torch's legacy format when `legacy`."""
    args = argparse.Namespace(**FLAGS, tensor_model_parallel_size=2, pipeline_model_parallel_size=2)
    for pp in range(2):
        for tp in range(2):
            stage = {}
            for name, tensor in weights.items():
                if stage_of(name) == pp:
                    local = name
                    if pp and name.startswith("layers."):
                        _, number, rest = name.split(".", 2)
                        local = f"layers.{int(number) - 2}.{rest}"
                    stage[local] = shard_of(name, tensor, tp, 2).clone()
            path = os.path.join(directory, megatron_iteration_dir(7), megatron_rank_dir(tp, pp, 2), MEGATRON_FILE)
            os.makedirs(os.path.dirname(path))
            torch.save({"model": nest(stage), "args": args, "iteration": 7, "checkpoint_version": 3.0}, path,
                       _use_new_zipfile_serialization=not legacy)
    with open(os.path.join(directory, LATEST_ITERATION_FILE), "w", encoding="utf-8") as handle:
        handle.write("7")
    return str(directory)


def zero3_source(directory, weights: dict, legacy: bool = False) -> str:
    """TP2 x DP2 at ZeRO stage 3 (plain engine) as DeepSpeed lays out its fp32 partitions: two parameter groups
    (matrices, vectors), each parameter split on its own into ceil(numel / DP) values per rank, padded."""
    tag_dir = os.path.join(directory, "global_step7")
    os.makedirs(tag_dir)
    args = {**FLAGS, "tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 1, "data_parallel_size": 2,
            "zero_stage": 3, "no_pipeline_parallel": True, "ds_pipeline_enabled": False}
    for tp in range(2):
        shards = {name: shard_of(name, tensor, tp, 2) for name, tensor in weights.items()}
        groups = [{name: shard.shape for name, shard in shards.items() if (shard.dim() > 1) == matrices}
                  for matrices in (True, False)]
        for dp in range(2):
            flats = []
            for group in groups:
                parts = []
                for name in group:
                    flat = shards[name].flatten()
                    per_rank = -(-flat.numel() // 2)
                    parts.append(torch.nn.functional.pad(flat, (0, 2 * per_rank - flat.numel()))
                                 [dp * per_rank:(dp + 1) * per_rank])
                flats.append(torch.cat(parts))
            torch.save({"module": None, "param_shapes": groups, "args": args, "iteration": 7},
                       os.path.join(tag_dir, model_states_file(tp, 3, dp)), _use_new_zipfile_serialization=not legacy)
            torch.save({"optimizer_state_dict": {"fp32_flat_groups": flats}},
                       os.path.join(tag_dir, optimizer_states_file(tp, dp)), _use_new_zipfile_serialization=not legacy)
    with open(os.path.join(directory, LATEST_TAG_FILE), "w", encoding="utf-8") as handle:
        handle.write("global_step7")
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
