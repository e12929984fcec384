"""The yardstick of the trainer's per-step overhead: a plain PyTorch training loop over a GPT-2 of the same shape.

A straightforward GPT-2 (embedding, pre-LN blocks with scaled-dot-product attention, tied head) trained with
torch's fused AdamW (the trainer's optimizer on CPU and CUDA) and gradient clipping on fixed synthetic tokens:
forward, backward, clip, step, nothing else.
Under several processes it is wrapped in torch's DistributedDataParallel, the bare data-parallel loop.
"""
import resource
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Shape:
    layers: int
    hidden: int
    heads: int
    seq: int
    batch: int  # per process (micro-batch)
    vocab: int


class ReferenceBlock(nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv, self.proj = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
        self.fc, self.out = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(h, dim=-1)
        q, k, v = (t.view(b, s, self.heads, h // self.heads).transpose(1, 2) for t in (q, k, v))
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, h))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class ReferenceGPT(nn.Module):
    def __init__(self, shape: Shape):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(shape.vocab, shape.hidden), nn.Embedding(shape.seq, shape.hidden)
        self.blocks = nn.ModuleList(ReferenceBlock(shape.hidden, shape.heads) for _ in range(shape.layers))
        self.ln_f = nn.LayerNorm(shape.hidden)

    def forward(self, tokens, labels):
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1]))
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


class BareLoop:
    """One iteration per call: forward, backward, clipping to norm 1, AdamW step."""

    def __init__(self, shape: Shape, seed: int = 0):
        torch.manual_seed(seed)
        self.model = ReferenceGPT(shape)
        self.parameters = list(self.model.parameters())
        self.optimizer = torch.optim.AdamW(self.parameters, lr=1e-4, weight_decay=0.01, fused=True)
        if dist.is_initialized() and dist.get_world_size() > 1:
            self.model = nn.parallel.DistributedDataParallel(self.model)
        self.text = torch.randint(0, shape.vocab, (shape.batch, shape.seq + 1))

    def __call__(self) -> None:
        loss = self.model(self.text[:, :-1], self.text[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.parameters, 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def interval_means_ms(step, intervals: int, interval: int) -> tuple:
    """Mean milliseconds per iteration over each of `intervals` runs of `interval` iterations, as the trainer's
    log lines report them: wall time, and this process's CPU time; and its minor page faults per iteration."""
    wall, cpu, faults = [], [], []
    for _ in range(intervals):
        start, start_cpu = time.perf_counter(), time.process_time()
        start_faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(interval):
            step()
        wall.append((time.perf_counter() - start) * 1000.0 / interval)
        cpu.append((time.process_time() - start_cpu) * 1000.0 / interval)
        faults.append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start_faults) / interval)
    return wall, cpu, faults
