"""This rank's part of the GPT, parallelised as the job says: what pretrain_gpt.py hands the training loop."""
import torch.distributed as dist
from torch import nn

from megatron.config.job import ParallelConfig
from megatron.errors import InputError
from megatron.model.gpt import GPTConfig, GPTModel, SelfAttention
from megatron.model.moe import MoEGPTModel, expert_parallel_rank
from megatron.model.parallelize import apply_tensor_parallel, piece_sharder
from megatron.model.pipe import GPTPipe, compiled_pieces
from megatron.model.ulysses import ulysses_pieces


def model_provider(model_config: GPTConfig, parallel_config: ParallelConfig, parallel_state, rng_tracker):
    """Its pipeline stage on DeepSpeed's pipeline engine (the default, as upstream), or with
    --no-pipeline-parallel the whole plain model (with experts: this rank's; with DeepSpeed-Ulysses its attention
    and loss over the whole sequence, model/ulysses.py); tensor-parallel pieces sharded either way; with
    --torch-compile compiled whole (apply_torch_compile)."""
    if parallel_config.pipeline_engine:
        model = GPTPipe(model_config, parallel_state, rng_tracker, parallel_config.sequence_parallel)
    else:
        model = plain_model(model_config, parallel_config, parallel_state, rng_tracker)
        model.checkpoint_layer = rng_tracker.checkpoint  # recomputation that rewinds the tracker's streams too
    for attention in (module for module in model.modules() if isinstance(module, SelfAttention)):
        attention.checkpoint_core = rng_tracker.checkpoint  # the same, for selective recomputation
    if model_config.torch_compile:
        apply_torch_compile(model)
    return model


def plain_model(model_config: GPTConfig, parallel_config: ParallelConfig, parallel_state, rng_tracker) -> GPTModel:
    """The GPTModel with each piece sharded as soon as it is built (model/parallelize.py's piece_sharder), or with
    experts an MoEGPTModel holding this rank's experts (model/moe.py), built whole and then sharded."""
    sequence_parallel = parallel_config.sequence_parallel
    if model_config.moe is None:
        return GPTModel(model_config, ulysses_pieces(piece_sharder(parallel_state, sequence_parallel, rng_tracker),
                                                     parallel_state))
    if parallel_config.tensor > 1 and dist.get_backend(parallel_state.get_tensor_model_parallel_group()) == "gloo":
        raise InputError(f"--tensor-model-parallel-size {parallel_config.tensor} with --num-experts above 1 over "
                         "gloo: DeepSpeed's MoE layer (0.19.8) gathers its expert outputs over the tensor-parallel "
                         "ranks (deepspeed/moe/sharded_moe.py:742) into a flat buffer (deepspeed/moe/mappings.py:"
                         "39-40), and gloo's all_gather_into_tensor takes only an output shaped as the inputs "
                         "stacked on dim 0; use nccl/hccl, or tensor-parallel size 1")
    model = MoEGPTModel(model_config, expert_parallel_rank(model_config.moe, parallel_state))
    if parallel_config.tensor > 1:
        apply_tensor_parallel(model, parallel_state, sequence_parallel, rng_tracker=rng_tracker,
                              experts=model_config.moe.expert_tensor_parallel)
    return model


def apply_torch_compile(model: nn.Module, backend: str = "inductor") -> None:
    """torch.compile over the module the engine calls, applied from outside like the parallel plans. The plain
    model is one compiled region from tokens to loss: embedding, every layer, final norm, head and the chunked
    loss (its autograd function traced forward and backward), so inductor fuses across piece boundaries too:
    each residual add with the norm that reads it, a linear's bias with the GeLU after it (in the GEMM's
    epilogue or in the GeLU's kernel), the loss's fp32 conversions with its reductions. A pipeline stage is run
    piece by piece by DeepSpeed's engine, so each of its pieces is compiled (pipe.compiled_pieces): the same
    fusions inside each piece, none across them. `backend`: torch.compile's (tests use a cheaper one)."""
    for module in compiled_pieces(model) if isinstance(model, GPTPipe) else (model,):
        module.compile(backend=backend)
