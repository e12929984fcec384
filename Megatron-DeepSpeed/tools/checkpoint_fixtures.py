"""Checkpoints in the layouts other programs write, made from a full state dict (GPTModel's names): Megatron's
(iter_N/mp_rank_XX_YYY/model_optim_rng.pt, as upstream's deepspeed_to_megatron.py writes it), DeepSpeed's ZeRO
stages 1-2 and 3 (the plain engine's fp32 partitions) and the trainer's at ZeRO 0 (DP 1). The conversion
benchmark and the reader's tests need such sources at any size without running those programs;
checkpoint/formats/detect.py documents the formats.
Megatron's files hold weights only; ZeRO 3's optionally Adam's moments, ZeRO 0-2's always."""
import argparse
import os
import shutil
from typing import Dict, List, Mapping, Optional

import torch

from megatron.checkpoint.torch_files import load_file
from megatron.checkpoint.file_names import (CHECKPOINT_VERSION, CHECKPOINT_VERSION_VALUE, LATEST_ITERATION_FILE,
                                        LATEST_TAG_FILE, LATEST_UNIVERSAL_FILE, MEGATRON_FILE, MEGATRON_MODEL,
                                        OPTIMIZER_SAVED, UNIVERSAL_DIR, UNIVERSAL_MARK, megatron_iteration_dir,
                                        megatron_rank_dir, model_states_file, optimizer_states_file)
from megatron.checkpoint.manifest import write_manifest
from megatron.checkpoint.parameter_names import LAYERS_PREFIX, nest
from megatron.checkpoint.formats.checkpoint import OptimizerState
from megatron.checkpoint.formats.partitions import flat_range
from megatron.checkpoint.torch_files import save
from megatron.checkpoint.shards import shard_of
from megatron.checkpoint.reshape.target_writer import TargetLayout, TrainingState, write_checkpoint
from megatron.model.gpt import GPTConfig


def _save(path: str, contents: object, legacy: bool) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.save(contents, path, _use_new_zipfile_serialization=not legacy)


def _write_text(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


def stage_layers(num_layers: int, stages: int) -> List[range]:
    """Megatron's even split of the transformer layers over pipeline stages (the first ones take the rest)."""
    bounds = [0]
    for stage in range(stages):
        bounds.append(bounds[-1] + num_layers // stages + (1 if stage < num_layers % stages else 0))
    return [range(bounds[stage], bounds[stage + 1]) for stage in range(stages)]


def write_megatron(directory: str, weights: Mapping[str, torch.Tensor], flags: Mapping[str, object], tensor: int,
                   pipeline: int, iteration: int, legacy: bool = False) -> None:
    """`weights` in Megatron's layout at TP `tensor` x PP `pipeline`: the embedding on the first stage, the final
    LayerNorm on the last, each stage numbering its layers from 0; in torch's legacy format when `legacy`."""
    num_layers = int(flags["num_layers"])
    layers = stage_layers(num_layers, pipeline)
    args = argparse.Namespace(**{**flags, "tensor_model_parallel_size": tensor,
                                 "pipeline_model_parallel_size": pipeline})
    for pp, stage in enumerate(layers):
        names: Dict[str, str] = {}  # GPTModel name -> its key in this stage's files
        for name in weights:
            if name.startswith(LAYERS_PREFIX):
                _, number, rest = name.split(".", 2)
                if int(number) in stage:
                    names[name] = f"{LAYERS_PREFIX}{int(number) - stage.start}.{rest}"
            elif (pp == 0) == name.startswith("embedding."):
                names[name] = name
        for tp in range(tensor):
            model = nest({key: shard_of(name, weights[name], tp, tensor).clone() for name, key in names.items()})
            _save(os.path.join(directory, megatron_iteration_dir(iteration), megatron_rank_dir(tp, pp, pipeline),
                               MEGATRON_FILE),
                  {MEGATRON_MODEL: model, "args": args, "iteration": iteration,
                   CHECKPOINT_VERSION: CHECKPOINT_VERSION_VALUE}, legacy)
    _write_text(os.path.join(directory, LATEST_ITERATION_FILE), str(iteration))


def zero3_partition(shards: Mapping[str, torch.Tensor], groups: List[List[str]], data: int, rank: int
                    ) -> List[torch.Tensor]:
    """Data-parallel rank `rank`'s flat fp32 partition of each parameter group: every parameter split on its own
    into ceil(numel / DP) values per rank (the last rank's padded with zeros), one after another."""
    flats = []
    for group in groups:
        parts = []
        for name in group:
            flat = shards[name].float().flatten()
            per_rank = -(-flat.numel() // data)
            padded = torch.nn.functional.pad(flat, (0, data * per_rank - flat.numel()))
            parts.append(padded[rank * per_rank:(rank + 1) * per_rank])
        flats.append(torch.cat(parts))
    return flats


def write_zero3(directory: str, weights: Mapping[str, torch.Tensor], flags: Mapping[str, object], tensor: int,
                data: int, iteration: int, adam: Optional[OptimizerState] = None, legacy: bool = False) -> None:
    """`weights` as DeepSpeed's plain engine saves them at ZeRO stage 3, TP `tensor` x DP `data`: per rank a
    model-states file (client state, `param_shapes`, no module) and an optimizer file holding its fp32
    partitions and, from `adam`, Adam's moments in the same layout (torch's state per parameter group), the
    parameters in two groups (matrices, then vectors, as the trainer's weight-decay groups). Without `adam`
    the client state says the optimizer state was not saved, so readers take the weights only."""
    tag = f"global_step{iteration}"
    args = {**flags, "tensor_model_parallel_size": tensor, "pipeline_model_parallel_size": 1,
            "data_parallel_size": data, "zero_stage": 3, "no_pipeline_parallel": True, "ds_pipeline_enabled": False}
    for tp in range(tensor):
        shards = {name: shard_of(name, full, tp, tensor) for name, full in weights.items()}
        groups = [[name for name, shard in shards.items() if (shard.dim() > 1) == matrices]
                  for matrices in (True, False)]
        shapes = [{name: shards[name].shape for name in group} for group in groups]
        moments = {kind: {name: shard_of(name, full, tp, tensor) for name, full in adam.tensors(kind).items()}
                   for kind in ("exp_avg", "exp_avg_sq")} if adam is not None else {}
        for dp in range(data):
            _save(os.path.join(directory, tag, model_states_file(tp, 3, dp)),
                  {"module": None, "param_shapes": shapes, "args": args, "iteration": iteration,
                   OPTIMIZER_SAVED: adam is not None}, legacy)
            partition = {"fp32_flat_groups": zero3_partition(shards, groups, data, dp)}
            if adam is not None:
                flats = {kind: zero3_partition(moment, groups, data, dp) for kind, moment in moments.items()}
                state = {group: {"step": torch.tensor(float(adam.step)), **{kind: flats[kind][group] for kind in flats}}
                         for group in range(len(groups))}
                partition["optimizer_state_dict"] = {"state": state, "param_groups": [
                    {**hyperparameters, "params": [group]} for group, hyperparameters in enumerate(adam.param_groups)]}
            _save(os.path.join(directory, tag, optimizer_states_file(tp, dp)), {"optimizer_state_dict": partition},
                  legacy)
    _write_text(os.path.join(directory, LATEST_TAG_FILE), tag)


def _flat_slice(tensors: List[torch.Tensor], data: int, rank: int, padded: bool) -> torch.Tensor:
    """Data-parallel rank `rank`'s consecutive slice of `tensors` flattened one after another, in fp32: the
    whole padded with zeros to `data` equal slices, the last slice kept unpadded unless `padded`."""
    total = sum(tensor.numel() for tensor in tensors)
    size = -(-total // data)
    length = max(0, min(size, total - rank * size))
    values = flat_range(tensors, rank * size, length).float().clone() if length else torch.zeros(0)
    return torch.nn.functional.pad(values, (0, size - length)) if padded else values


def write_zero12(directory: str, weights: Mapping[str, torch.Tensor], adam: OptimizerState,
                 flags: Mapping[str, object], tensor: int, data: int, iteration: int, stage: int = 1) -> None:
    """`weights` and `adam` as DeepSpeed's plain engine saves them at ZeRO stage `stage` (1 or 2), TP `tensor` x
    DP `data`: per tensor-parallel rank a model-states file (the module, `param_shapes`) and per data-parallel
    rank an optimizer file holding its consecutive slice of each group's flat buffer (the group's parameters one
    after another, no alignment padding, the buffer padded with zeros to DP equal slices): the fp32 master
    weights (the last slice without that padding, as DeepSpeed keeps them) and Adam's moments (padded), in two
    groups (matrices, then vectors, as the trainer's weight-decay groups). One file's values are made at a time."""
    tag = f"global_step{iteration}"
    args = {**flags, "tensor_model_parallel_size": tensor, "pipeline_model_parallel_size": 1,
            "data_parallel_size": data, "zero_stage": stage, "no_pipeline_parallel": True, "ds_pipeline_enabled": False}
    kinds = {"fp32": weights, "exp_avg": adam.exp_avg, "exp_avg_sq": adam.exp_avg_sq}
    for tp in range(tensor):
        shards = {kind: {name: shard_of(name, full, tp, tensor) for name, full in tensors.items()}
                  for kind, tensors in kinds.items()}
        groups = [[name for name, shard in shards["fp32"].items() if (shard.dim() > 1) == matrices]
                  for matrices in (True, False)]
        _save(os.path.join(directory, tag, model_states_file(tp, stage)),
              {"module": nest({name: shard.clone() for name, shard in shards["fp32"].items()}), "optimizer": None,
               "param_shapes": [{name: shards["fp32"][name].shape for name in group} for group in groups],
               "args": args, "iteration": iteration, OPTIMIZER_SAVED: True}, False)
        for dp in range(data):
            def flat(kind: str, group: List[str]) -> torch.Tensor:
                return _flat_slice([shards[kind][name] for name in group], data, dp, padded=kind != "fp32")
            state = {index: {"step": torch.tensor(float(adam.step)),
                             **{kind: flat(kind, group) for kind in ("exp_avg", "exp_avg_sq")}}
                     for index, group in enumerate(groups)}
            _save(os.path.join(directory, tag, optimizer_states_file(tp, dp)), {"optimizer_state_dict": {
                "single_partition_of_fp32_groups": [flat("fp32", group) for group in groups],
                "base_optimizer_state": {"state": state, "param_groups": [
                    {**hyperparameters, "params": [index]} for index, hyperparameters in enumerate(adam.param_groups)]},
                "param_alignment_paddings": [[0] * len(group) for group in groups], "zero_stage": stage}}, False)
    _write_text(os.path.join(directory, LATEST_TAG_FILE), tag)


def write_zero0(directory: str, weights: Mapping[str, torch.Tensor], config: GPTConfig, state: TrainingState,
                target: TargetLayout, adam: OptimizerState) -> None:
    """`weights` and `adam` as the trainer saves them at ZeRO 0 and DP 1 (torch's Adam state in each model-parallel
    rank's model-states file): the writer's checkpoint without its universal files and mark."""
    tag_dir = write_checkpoint(directory, weights, config, state, target, adam)
    shutil.rmtree(os.path.join(tag_dir, UNIVERSAL_DIR))
    os.remove(os.path.join(directory, LATEST_UNIVERSAL_FILE))
    for name in sorted(os.listdir(tag_dir)):
        if name.startswith("mp_rank_"):
            contents = load_file(os.path.join(tag_dir, name), mmap=False)  # not a map of the file rewritten
            contents.pop(UNIVERSAL_MARK)
            contents["args"] = argparse.Namespace(**{**vars(contents["args"]), "data_parallel_size": 1,
                                                     "zero_stage": 0})
            save(os.path.join(tag_dir, name), contents)
    write_manifest(tag_dir)
