"""Test helpers over a trained model's state."""
from typing import Dict

import torch
from deepspeed.pipe import PipelineModule
from torch import nn

from megatron.model.parallelize import gated, tensor_parallel_partition_dim
from megatron.tensor_parallel.plan import join_shards


def gather_full_state_dict(model: nn.Module, parallel_state) -> Dict[str, torch.Tensor]:
    """The single-process GPTModel's state dict, rebuilt on every rank by joining the tensor-parallel shards
    and, for a pipeline stage, collecting every stage's pieces under GPTModel's names (a collective: every
    rank of the model's groups must call it)."""
    pipelined = isinstance(model, PipelineModule)  # model/pipe.py's GPTPipe: it knows its pieces' names
    group = parallel_state.get_tensor_model_parallel_group()
    full, swiglu = {}, gated(model)
    for name, tensor in model.state_dict(keep_vars=True).items():
        name = model.single_process_name(name) if pipelined else name
        full[name] = join_shards(tensor, tensor_parallel_partition_dim(name, swiglu=swiglu), group)
    if pipelined:
        return model.single_process_state_dict(full, parallel_state.get_pipeline_model_parallel_group())
    return full
