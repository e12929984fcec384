"""Generating for a list of prompts over tensor x data parallelism.

Each data-parallel replica (one tensor-parallel group) takes every DP-th prompt, decodes its share in batches,
and the results are collected on every rank in prompt order. Replicas never wait for each other until the
end, so they may need different numbers of steps.
"""
import logging
import time
from dataclasses import dataclass
from typing import List, Sequence

import torch.distributed as dist

from megatron.inference.generation import generate_batch
from megatron.inference.sampling import SamplingParams, prompt_generators
from megatron.model.gpt import GPTModel

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Generated:
    index: int  # of the prompt in the input
    prompt_ids: List[int]
    generated_ids: List[int]
    tokens_per_second: float  # of the batch it was decoded in (new tokens of all its rows / its wall time)


def generate_for_prompts(model: GPTModel, prompts: Sequence[Sequence[int]], *, batch_size: int,
                         max_new_tokens: int, params: SamplingParams, eod: int, vocab_size: int,
                         data_parallel_rank: int = 0, data_parallel_size: int = 1, tensor_parallel_group=None,
                         use_kv_cache: bool = True) -> List[Generated]:
    """Every prompt's generation, on every rank (a collective: all ranks call it with the same prompts)."""
    mine = list(range(data_parallel_rank, len(prompts), data_parallel_size))
    results = []
    for first in range(0, len(mine), batch_size):
        indices = mine[first:first + batch_size]
        started = time.perf_counter()
        outputs = generate_batch(model, [prompts[i] for i in indices], max_new_tokens, params,
                                 prompt_generators(params.seed, indices), eod, vocab_size,
                                 use_kv_cache=use_kv_cache, tensor_parallel_group=tensor_parallel_group)
        seconds = time.perf_counter() - started
        rate = sum(map(len, outputs)) / seconds
        results += [Generated(i, list(prompts[i]), output, rate) for i, output in zip(indices, outputs)]
        if is_first_rank():
            _log.info("%d/%d prompts of data-parallel rank 0 done (%.1f tokens/s)", first + len(indices), len(mine),
                      rate)
    return _collect(results, len(prompts))


def is_first_rank() -> bool:
    """Whether this process reports progress: global rank 0 (data-parallel rank 0's first tensor-parallel rank)."""
    return not dist.is_initialized() or dist.get_rank() == 0


def _collect(results: List[Generated], count: int) -> List[Generated]:
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return sorted(results, key=lambda result: result.index)
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, results)
    by_index = {result.index: result for rank_results in gathered for result in rank_results}
    return [by_index[index] for index in range(count)]
