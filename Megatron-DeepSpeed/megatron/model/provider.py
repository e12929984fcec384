"""This rank's part of the GPT, parallelised as the job says: what pretrain_gpt.py hands the training loop."""
from torch import nn

from megatron.config.job import ParallelConfig
from megatron.model.cross_entropy import compiled_chunk_kernels
from megatron.model.gpt import GPTConfig, GPTModel, LanguageModelLoss, TransformerLayer
from megatron.model.parallelize import apply_tensor_parallel
from megatron.model.pipe import GPTPipe


def model_provider(model_config: GPTConfig, parallel_config: ParallelConfig, parallel_state, rng_tracker):
    """Its pipeline stage on DeepSpeed's pipeline engine (the default, as upstream), or with
    --no-pipeline-parallel the whole plain model; tensor-parallel pieces sharded either way; with
    --torch-compile each transformer layer and the loss's per-chunk math compiled."""
    if parallel_config.pipeline_engine:
        model = GPTPipe(model_config, parallel_state, rng_tracker, parallel_config.sequence_parallel)
    else:
        model = GPTModel(model_config)
        model.checkpoint_layer = rng_tracker.checkpoint  # recomputation that rewinds the tracker's streams too
        if parallel_config.tensor > 1:
            apply_tensor_parallel(model, parallel_state, parallel_config.sequence_parallel, rng_tracker=rng_tracker)
    if model_config.torch_compile:
        apply_torch_compile(model)
    return model


def apply_torch_compile(model: nn.Module) -> None:
    """Each transformer layer's forward, and the loss's per-chunk math, through torch.compile, applied from
    outside like the parallel plans. The layers are instances of one class, so they share the compiled code:
    compiling costs one layer's time."""
    for module in model.modules():
        if isinstance(module, TransformerLayer):
            module.compile()
        elif isinstance(module, LanguageModelLoss):
            module.chunk_kernels = compiled_chunk_kernels()
