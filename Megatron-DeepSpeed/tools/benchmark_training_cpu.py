"""Training throughput on CPU: our pretrain_gpt.py step (DeepSpeed engine, fp32) versus a plain PyTorch loop.

The reference is a straightforward GPT-2 of the same shape written here (embedding, pre-LN blocks with
scaled-dot-product attention, tied head), trained with torch.optim.AdamW and gradient clipping, on the same
batch shape. Both run in one process on the same synthetic tokens. Printed: tokens/s of each (steady state,
warm-up excluded, median over alternating rounds) and their ratio.

  python tools/benchmark_training_cpu.py [--layers 4 --hidden 256 --heads 8 --seq 256 --batch 8 --iters 30]
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

TOOLS = os.path.dirname(os.path.abspath(__file__))

from megatron.training.log_lines import parse_log

WARMUP_ITERATIONS = 5


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
    def __init__(self, vocab, seq, hidden, heads, layers):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, hidden), nn.Embedding(seq, hidden)
        self.blocks = nn.ModuleList(ReferenceBlock(hidden, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden)

    def forward(self, tokens, labels):
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1]))
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


def reference_tokens_per_second(args) -> float:
    torch.manual_seed(0)
    model = ReferenceGPT(args.vocab, args.seq, args.hidden, args.heads, args.layers)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    text = torch.randint(0, args.vocab, (args.batch, args.seq + 1))
    times = []
    for _ in range(args.iters):
        start = time.perf_counter()
        loss = model(text[:, :-1], text[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    return args.batch * args.seq / statistics.median(times[WARMUP_ITERATIONS:])


def our_tokens_per_second(args) -> float:
    command = [sys.executable, os.path.join(os.path.dirname(TOOLS), "pretrain_gpt.py"), "--mock-data",
               "--tokenizer-type", "NullTokenizer", "--vocab-size", str(args.vocab - 1),
               "--make-vocab-size-divisible-by", "1", "--num-layers", str(args.layers),
               "--hidden-size", str(args.hidden), "--num-attention-heads", str(args.heads),
               "--seq-length", str(args.seq), "--micro-batch-size", str(args.batch), "--global-batch-size",
               str(args.batch), "--train-iters", str(args.iters), "--lr", "1e-4", "--hidden-dropout", "0",
               "--attention-dropout", "0", "--log-interval", "1", "--eval-iters", "0", "--num-workers", "0",
               "--zero-stage", "0"]
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    milliseconds = [record.elapsed_ms for record in parse_log(result.stdout.splitlines()).iterations]
    return args.batch * args.seq / (statistics.median(milliseconds[WARMUP_ITERATIONS:]) / 1000.0)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3,
                        help="alternate the two loops this many times and take medians: a shared machine's "
                             "speed drifts by 10-20%% from minute to minute")
    args = parser.parse_args()
    rounds = [(our_tokens_per_second(args), reference_tokens_per_second(args)) for _ in range(args.rounds)]
    ours = statistics.median(round_[0] for round_ in rounds)
    reference = statistics.median(round_[1] for round_ in rounds)
    print("rounds (ours / reference tokens/s): " + ", ".join(f"{o:,.0f} / {r:,.0f}" for o, r in rounds))
    print(f"GPT {args.layers} layers, hidden {args.hidden}, {args.heads} heads, seq {args.seq}, batch {args.batch}, "
          f"vocab {args.vocab}, fp32, {torch.get_num_threads()} threads")
    print(f"pretrain_gpt.py (DeepSpeed engine): {ours:,.0f} tokens/s")
    print(f"plain PyTorch loop (AdamW):         {reference:,.0f} tokens/s")
    print(f"ratio ours / reference: {ours / reference:.2f}")


if __name__ == "__main__":
    main()
