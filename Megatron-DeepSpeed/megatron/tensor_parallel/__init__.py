"""Tensor and sequence parallelism: named communication functions, sharded layers, the RNG streams dropout
draws from under tensor parallelism, and the once-per-step sum of the sequence-parallel gradients. (The
vocab-parallel cross entropy is megatron/model/cross_entropy.py, shared with the unsplit model.)"""
from megatron.tensor_parallel.layers import (ColumnParallelLinear, RNGForkedDropout, RowParallelLinear,
                                             VocabParallelEmbedding, column_parallel_linear, shard_of, shard_parameter)
from megatron.tensor_parallel.mappings import (copy_to_tensor_parallel_region, gather_from_sequence_parallel_region,
                                               gather_from_tensor_parallel_region, reduce_from_tensor_parallel_region,
                                               reduce_scatter_to_sequence_parallel_region,
                                               scatter_to_sequence_parallel_region, scatter_to_tensor_parallel_region)
from megatron.tensor_parallel.random import MODEL_PARALLEL_RNG, RNGStatesTracker, tensor_parallel_rng_tracker
from megatron.tensor_parallel.sequence_parallel_grads import (mark_sequence_parallel,
                                                              sum_sequence_parallel_gradients_each_step)

__all__ = [
    "ColumnParallelLinear", "RNGForkedDropout", "RowParallelLinear", "VocabParallelEmbedding", "column_parallel_linear",
    "shard_of", "shard_parameter",
    "copy_to_tensor_parallel_region", "gather_from_sequence_parallel_region", "gather_from_tensor_parallel_region",
    "reduce_from_tensor_parallel_region", "reduce_scatter_to_sequence_parallel_region",
    "scatter_to_sequence_parallel_region", "scatter_to_tensor_parallel_region",
    "MODEL_PARALLEL_RNG", "RNGStatesTracker", "tensor_parallel_rng_tracker",
    "mark_sequence_parallel", "sum_sequence_parallel_gradients_each_step",
]
