"""Batched autoregressive decoding of a GPTModel, plain or tensor-parallel.

Prompts of different lengths are padded on the LEFT to a common length, so every row's newest token sits in
the same column and one step feeds one column. Each row's position ids start at 0 at its first real token,
and no real token attends to padding: the padding is a document of its own (segment 0, the prompt and what
follows segment 1; model/attention_spec.py), whose (unused) values stay finite. A sliding window counts columns,
which within a row's real tokens are its positions. With the KV cache (kv_cache.py) the model walks its own pieces
(embedding, layers, final LayerNorm, tied LM head) feeding only the new column each step; without it the whole
sequence goes through GPTModel.forward again every step, the simple oracle the cache must equal.

Under tensor parallelism the LM head yields this rank's slice of the vocabulary; the slices are gathered
before choosing, and the token chosen on tensor-parallel rank 0 is broadcast so all ranks continue alike.
"""
from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch
import torch.distributed as dist

from megatron.inference.kv_cache import KVCache
from megatron.inference.sampling import SamplingParams, choose_next_tokens
from megatron.model.gpt import GPTModel
from megatron.tensor_parallel import gather_from_tensor_parallel_region


@dataclass
class PaddedBatch:
    """Prompts left-padded to `prompt_length` columns, with room for the new tokens on the right."""
    tokens: torch.Tensor  # int64 [batch, prompt_length + max_new_tokens]
    position_ids: torch.Tensor  # int64, same shape
    is_padding: torch.Tensor  # bool, same shape
    prompt_length: int

    @classmethod
    def left_padded(cls, prompts: Sequence[Sequence[int]], max_new_tokens: int, pad_id: int,
                    device: torch.device) -> "PaddedBatch":
        prompt_length = max(len(prompt) for prompt in prompts)
        columns = torch.arange(prompt_length + max_new_tokens)
        padding = torch.tensor([prompt_length - len(prompt) for prompt in prompts]).unsqueeze(1)
        tokens = torch.full((len(prompts), len(columns)), pad_id, dtype=torch.long)
        for row, prompt in enumerate(prompts):
            tokens[row, prompt_length - len(prompt):prompt_length] = torch.tensor(prompt, dtype=torch.long)
        return cls(tokens.to(device), (columns - padding).clamp(min=0).to(device), (columns < padding).to(device),
                   prompt_length)

    def segment_ids(self, end: int) -> Optional[torch.Tensor]:
        """int64 [batch, end] of the columns before `end`: padding 0, real tokens 1; None where no row is padded
        (one stream)."""
        if not self.is_padding.any():
            return None
        return (~self.is_padding[:, :end]).long()


def cached_step_logits(model: GPTModel, batch: PaddedBatch, cache: KVCache, end: int) -> torch.Tensor:
    """Feed the columns after the cached ones up to `end`; logits [batch, vocab (slice)] of column end - 1."""
    start = cache.length
    position_ids = batch.position_ids[:, start:end]
    hidden = model.embedding(batch.tokens[:, start:end], position_ids)
    segment_ids = batch.segment_ids(end)
    for layer, layer_cache in zip(model.layers, cache.layers):
        hidden = layer(hidden, position_ids, segment_ids, kv_cache=layer_cache)
    last = model.final_layernorm(hidden[:, -1])
    return model.lm_head(last, model.embedding.word_embeddings.weight)


def recomputed_step_logits(model: GPTModel, batch: PaddedBatch, end: int) -> torch.Tensor:
    """The whole sequence up to `end` through GPTModel.forward; logits of column end - 1."""
    logits = model(batch.tokens[:, :end], position_ids=batch.position_ids[:, :end],
                   segment_ids=batch.segment_ids(end))
    return logits[:, -1]


def full_vocabulary_logits(logits: torch.Tensor, tensor_parallel_group, vocab_size: int) -> torch.Tensor:
    """Logits over the tokenizer's vocabulary from this rank's slice of the padded one: the slices are joined
    across the tensor-parallel group (None: the logits are whole already) and the padding rows dropped."""
    if tensor_parallel_group is not None:
        logits = gather_from_tensor_parallel_region(logits, tensor_parallel_group)
    return logits[..., :vocab_size]


def same_on_tensor_parallel_ranks(tokens: torch.Tensor, group) -> torch.Tensor:
    """The tokens tensor-parallel rank 0 chose, on every rank of the group."""
    if group is None or dist.get_world_size(group) == 1:
        return tokens
    dist.broadcast(tokens, src=dist.get_global_rank(group, 0), group=group)
    return tokens


@torch.no_grad()
def generate_batch(model: GPTModel, prompts: Sequence[Sequence[int]], max_new_tokens: int, params: SamplingParams,
                   generators: List[torch.Generator], eod: Optional[int], vocab_size: int, use_kv_cache: bool = True,
                   tensor_parallel_group=None) -> List[List[int]]:
    """The tokens generated after each prompt: up to max_new_tokens, ending early with (and including) the
    end-of-document id `eod` (None: never early). vocab_size is the tokenizer's: the padding rows of the
    embedding are never chosen. `model` must be in eval mode; every rank of tensor_parallel_group calls this
    with the same prompts."""
    if model.training:
        raise ValueError("generate_batch needs the model in eval mode (model.eval()): dropout would randomise it")
    device = model.device
    pad_id = 0 if eod is None else eod  # what padding holds never matters: it is masked
    batch = PaddedBatch.left_padded(prompts, max_new_tokens, pad_id, device)
    cache = KVCache(len(model.layers), batch.tokens.shape[1]) if use_kv_cache else None
    finished = torch.zeros(len(prompts), dtype=torch.bool)
    steps = []
    for end in range(batch.prompt_length, batch.prompt_length + max_new_tokens):
        logits = (cached_step_logits(model, batch, cache, end) if use_kv_cache
                  else recomputed_step_logits(model, batch, end))
        logits = full_vocabulary_logits(logits, tensor_parallel_group, vocab_size)
        chosen = choose_next_tokens(logits.float().cpu(), params, generators)
        chosen = same_on_tensor_parallel_ranks(chosen.to(device), tensor_parallel_group).cpu()
        chosen = chosen.masked_fill(finished, pad_id)
        batch.tokens[:, end] = chosen.to(device)
        steps.append(chosen)
        if eod is not None:
            finished |= chosen == eod
        if finished.all():
            break
    return [_through_first(row, eod) for row in torch.stack(steps, dim=1).tolist()]


def _through_first(ids: List[int], stop: Optional[int]) -> List[int]:
    return ids[:ids.index(stop) + 1] if stop in ids else ids
