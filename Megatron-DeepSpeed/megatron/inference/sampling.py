"""Choosing the next token from the logits: greedy, or sampling with temperature, top-k and top-p.

Sampling draws on the CPU from one torch.Generator per prompt, seeded by (--seed, the prompt's index): a
prompt's text then depends on neither the batch it shares, nor the data-parallel rank that decodes it, nor the
device, and a rerun with the same seed repeats it exactly.
"""
import math
from dataclasses import dataclass
from typing import List, Sequence

import numpy as np
import torch

from megatron.errors import InputError


@dataclass(frozen=True)
class SamplingParams:
    greedy: bool = True
    temperature: float = 1.0
    top_k: int = 0  # 0: no top-k filtering
    top_p: float = 1.0  # 1.0: no nucleus filtering
    seed: int = 1234

    def __post_init__(self):
        if not 0 < self.temperature < math.inf:  # also refuses nan, which every comparison fails
            raise InputError(f"--temperature {self.temperature} must be a finite number greater than 0 (use "
                             f"--greedy for argmax)")
        if self.top_k < 0:
            raise InputError(f"--top-k {self.top_k} must be 0 (off) or a positive number of tokens")
        if not 0.0 < self.top_p <= 1.0:
            raise InputError(f"--top-p {self.top_p} must be in (0, 1] (1 turns nucleus sampling off)")


def prompt_generators(seed: int, prompt_indices: Sequence[int]) -> List[torch.Generator]:
    """One CPU generator per prompt, seeded from (seed, prompt index) so that streams never collide."""
    generators = []
    for index in prompt_indices:
        state = np.random.SeedSequence([seed, index]).generate_state(2, dtype=np.uint32)
        generators.append(torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1])))
    return generators


def filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Logits [batch, vocab] scaled by the temperature, with the tokens outside the top-k and outside the
    smallest set whose probability reaches top-p set to -inf (the most likely token always stays)."""
    logits = logits / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth_largest = torch.topk(logits, params.top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probabilities = sorted_logits.softmax(dim=-1)
        mass_before = probabilities.cumsum(dim=-1) - probabilities
        outside = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, order, mass_before >= params.top_p)
        logits = logits.masked_fill(outside, float("-inf"))
    return logits


def choose_next_tokens(logits: torch.Tensor, params: SamplingParams, generators: List[torch.Generator]) -> torch.Tensor:
    """The next token of every row of logits [batch, vocab] (fp32, on the CPU), as int64 [batch]."""
    if params.greedy:
        return logits.argmax(dim=-1)
    probabilities = filter_logits(logits, params).softmax(dim=-1)
    return torch.cat([torch.multinomial(row, 1, generator=generator)
                      for row, generator in zip(probabilities, generators)])
