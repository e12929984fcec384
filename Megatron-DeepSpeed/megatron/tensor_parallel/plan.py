"""Declarative tensor parallelism: a plan maps module paths to parallel styles, and one function applies it.

A plan is a mapping {path pattern: style}. Patterns are dotted module paths as named_modules() spells them, in
which `*` stands for any one component (a layer index): "layers.*.self_attention.dense"; "" is the root. A style
says what the module at such a path becomes (`apply`), checks first that it can be split (`check`), and names
which of its parameters are split across tensor-parallel ranks and how (`partition_dims`: a Split, along which
dim and in how many blocks): that is all that joining shards into full weights, or splitting full weights into
shards, needs to know.
"""
import functools
from collections import OrderedDict
from dataclasses import dataclass
from typing import Mapping, NamedTuple, Optional

import torch
import torch.distributed as dist
from torch import nn

from megatron.errors import require_divisible
from megatron.tensor_parallel.layers import (ColumnParallelLinear, RNGForkedDropout, RowParallelLinear,
                                             VocabParallelEmbedding)
from megatron.tensor_parallel.mappings import scatter_to_sequence_parallel_region, summed_over_ranks
from megatron.tensor_parallel.random import RNGStatesTracker
from megatron.tensor_parallel.sequence_parallel_grads import mark_sequence_parallel


class Split(NamedTuple):
    """How a parameter is split over the tensor-parallel ranks: along `dim`, which holds `blocks` equal consecutive
    blocks, each cut into one slice per rank (layers.shard_of). A SwiGLU MLP's dense_h_to_4h is 2 blocks, [gate;
    up]: rank r holds [gate_r; up_r], upstream Megatron-DeepSpeed's order."""
    dim: int
    blocks: int = 1


@dataclass(frozen=True)
class ShardingContext:
    """What styles need when they are applied."""
    group: object  # the tensor-parallel process group
    sequence_parallel: bool
    rng_tracker: RNGStatesTracker  # dropout on tensors that differ across ranks draws from its stream


def require_divisible_by_tp(value: int, world_size: int, what: str, fix: str) -> None:
    require_divisible(what, value, "--tensor-model-parallel-size", world_size, fix)


class ParallelStyle:
    """How one module takes part in tensor parallelism. Subclasses set `expected_type` (what the plan expects to
    find at the path) and `partition_dims` ({parameter name in the module: its Split over the ranks})."""
    expected_type = nn.Module
    partition_dims: Mapping[str, Split] = {}

    def check(self, module: nn.Module, path: str, world_size: int) -> None:
        """Raise before anything is changed if `module` cannot take this style."""
        if not isinstance(module, self.expected_type):
            raise TypeError(f"the tensor-parallel plan expects {self.expected_type.__name__} at {path!r} but found "
                            f"{type(module).__name__} (is the plan applied twice, or out of date with the model?)")

    def apply(self, module: nn.Module, context: ShardingContext) -> nn.Module:
        """The module that takes `module`'s place (`module` itself when it is only marked or adjusted)."""
        raise NotImplementedError


class ColumnParallel(ParallelStyle):
    """nn.Linear -> ColumnParallelLinear: output features (weight rows, bias) split over the ranks, each of their
    `blocks` separately (Split)."""
    expected_type = nn.Linear

    def __init__(self, what: str = "output features", fix: str = "choose a tensor-parallel size that divides it",
                 blocks: int = 1):
        self.what, self.fix, self.blocks = what, fix, blocks
        self.partition_dims = {"weight": Split(0, blocks), "bias": Split(0, blocks)}

    def check(self, module, path, world_size):
        super().check(module, path, world_size)
        require_divisible_by_tp(module.out_features // self.blocks, world_size, self.what, self.fix)

    def apply(self, module, context):
        return ColumnParallelLinear(module.weight, module.bias, context.group, context.sequence_parallel,
                                    self.blocks)


class RowParallel(ParallelStyle):
    """nn.Linear -> RowParallelLinear: input features (weight columns) split; the bias stays whole."""
    expected_type = nn.Linear
    partition_dims = {"weight": Split(1)}

    def __init__(self, what: str = "input features", fix: str = "choose a tensor-parallel size that divides it"):
        self.what, self.fix = what, fix

    def check(self, module, path, world_size):
        super().check(module, path, world_size)
        require_divisible_by_tp(module.in_features, world_size, self.what, self.fix)

    def apply(self, module, context):
        return RowParallelLinear(module.weight, module.bias, context.group, context.sequence_parallel)


class VocabParallel(ParallelStyle):
    """nn.Embedding -> VocabParallelEmbedding: vocabulary rows split over the ranks."""
    expected_type = nn.Embedding
    partition_dims = {"weight": Split(0)}

    def check(self, module, path, world_size):
        super().check(module, path, world_size)
        require_divisible_by_tp(module.num_embeddings, world_size, "the padded vocabulary size",
                          "pad the vocabulary with megatron.tokenizer.vocab_size_with_padding(..., "
                          "tensor_model_parallel_size)")

    def apply(self, module, context):
        return VocabParallelEmbedding(module.weight, context.group)


class SequenceParallel(ParallelStyle):
    """A module replicated on every rank (a LayerNorm) that, with sequence parallelism, sees only this rank's
    sequence chunk: its parameters are marked, and their gradients summed over the ranks once per step
    (sequence_parallel_grads)."""

    def apply(self, module, context):
        if context.sequence_parallel:
            for parameter in module.parameters():
                mark_sequence_parallel(parameter)
        return module


class SharedOverHeads(ParallelStyle):
    """A module replicated on every rank but applied to this rank's heads only (Qwen3's query and key norms): each
    rank's gradient is its heads' part, so every backward pass sums it over the ranks (a gradient hook, before
    accumulation), whatever the ZeRO stage or pipeline schedule. Whole on every rank, so never split."""

    def apply(self, module, context):
        for parameter in module.parameters():
            parameter.register_hook(functools.partial(summed_over_ranks, group=context.group))
        return module


class SequenceParallelDropout(ParallelStyle):
    """Dropout on activations that, with sequence parallelism, are this rank's sequence chunk: it then draws from
    the model-parallel stream so the ranks' masks differ. Without sequence parallelism it is left alone."""
    expected_type = nn.Dropout

    def apply(self, module, context):
        return RNGForkedDropout(module.p, context.rng_tracker) if context.sequence_parallel else module


class ScatterToSequenceParallelRegion(nn.Module):
    def __init__(self, group):
        super().__init__()
        self.group = group

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return scatter_to_sequence_parallel_region(hidden, self.group)


class SequenceChunkingDropout(SequenceParallelDropout):
    """The dropout where sequence parallelism begins: with it, this rank keeps its chunk of the sequence and then
    drops out in the model-parallel stream."""

    def apply(self, module, context):
        if not context.sequence_parallel:
            return module
        return nn.Sequential(OrderedDict(scatter_to_sequence_chunks=ScatterToSequenceParallelRegion(context.group),
                                         dropout=super().apply(module, context)))


def style_for(plan: Mapping[str, ParallelStyle], path: str) -> Optional[ParallelStyle]:
    """The style of the first pattern in `plan` that matches module path `path`, or None."""
    components = path.split(".")
    for pattern, style in plan.items():
        parts = pattern.split(".")
        if len(parts) == len(components) and all(part in ("*", name) for part, name in zip(parts, components)):
            return style
    return None


def partition_dim(plan: Mapping[str, ParallelStyle], parameter_name: str) -> Optional[Split]:
    """How `plan` splits the parameter of this full name, or None where it stays whole."""
    module_path, _, name = parameter_name.rpartition(".")
    style = style_for(plan, module_path)
    return None if style is None else style.partition_dims.get(name)


def parallelize_module(module: nn.Module, plan: Mapping[str, ParallelStyle], context: ShardingContext,
                       path: str = "") -> nn.Module:
    """Apply `plan` to `module`, whose own path in the tree the plan describes is `path` (a pipeline stage's
    piece of a model has one), and to its submodules. Every style is checked before anything changes. Returns
    the module that takes `module`'s place: itself, changed in place, unless a style at its own path replaces
    it."""
    targets = [(name, submodule, style) for name, submodule in module.named_modules(prefix=path)
               if (style := style_for(plan, name)) is not None]
    world_size = dist.get_world_size(context.group)
    for name, submodule, style in targets:
        style.check(submodule, name, world_size)
    replaced_root = module
    for name, submodule, style in targets:
        replacement = style.apply(submodule, context)
        if name == path:
            replaced_root = replacement
        elif replacement is not submodule:
            parent, _, attribute = name[len(path) + 1 if path else 0:].rpartition(".")
            setattr(module.get_submodule(parent), attribute, replacement)
    return replaced_root


def join_shards(tensor: torch.Tensor, split: Optional[Split], group) -> torch.Tensor:
    """The full tensor from every rank's shard as `split` cut it (a collective over `group`); a copy of `tensor`
    where it is not split (None)."""
    local = tensor.detach().contiguous()
    world_size = dist.get_world_size(group)
    if split is None or world_size == 1:
        return local.clone()
    shards = [torch.empty_like(local) for _ in range(world_size)]
    dist.all_gather(shards, local, group=group)
    return joined(shards, split)


def joined(shards, split: Split) -> torch.Tensor:
    """The full tensor of the ranks' `shards` (in rank order) as `split` cut it."""
    blocked = [shard.unflatten(split.dim, (split.blocks, -1)) for shard in shards]
    return torch.cat(blocked, dim=split.dim + 1).flatten(split.dim, split.dim + 1)

