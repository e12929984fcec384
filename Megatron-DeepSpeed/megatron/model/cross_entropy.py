"""Token cross entropy computed in fp32 from logits kept in their own dtype, optionally vocab-split across ranks.

The logits are the largest tensor of a GPT step ([tokens, vocabulary]: 1.6 GB in bf16 for 345M at micro batch
16). The textbook way (`F.cross_entropy(logits.float())`) makes an fp32 copy, keeps fp32 log-probabilities
for backward and builds three fp32 vocabulary-sized tensors there: about 40 bytes of memory traffic and up to
14 bytes of live memory per logit. Here the work goes in row chunks whose fp32 temporaries stay small, through
softmax with dtype=fp32, and backward writes the gradient straight in the logits' dtype. Only the logits
themselves (which exist anyway), the labels and one fp32 value per token are kept for backward. Eager, the memory traffic
is about that of the textbook way; compiled, the per-chunk math is fused, down to about 12 bytes per logit (two
reading passes forward, three backward): under --torch-compile the loss is traced with the whole model, and
ChunkKernels compiles the chunk math alone, which every CUDA run uses (model/kernels.py's loss_kernels).

The model's own loss (model/gpt.py's LanguageModelLoss) lets backward write the gradient over the logits, chunk by
chunk once each chunk's softmax is taken (as Megatron's loss does): the logits are made for the loss alone, so no
second logits-sized buffer is needed. On a CPU that buffer, freshly allocated each step, also cost its first touch
of every page (about 7 ms for 16 MB), as did chunks larger than the cache: there chunks are a few MiB
(model/kernels.py's loss_chunk_bytes).

Vocabulary split across the ranks of `group` (tensor parallelism): each rank holds its slice of the PADDED
vocabulary. Each combines its slice's log-sum-exp with the others' through two all-reduces of [tokens]
vectors, so every rank gets the exact per-token loss without gathering logits; the gradient (softmax minus
one-hot) needs no communication because each rank owns its slice of it.
"""
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F

CHUNK_BYTES = 1 << 28  # fp32 temporaries per row chunk: large enough for full-speed kernels, small beside the logits


def chunk_statistics(chunk, local_labels, elsewhere):
    """Per row of a chunk, in fp32: its largest logit, the log-sum-exp of its logits minus that one (between 0
    and log vocabulary; kept apart so that large logits lose no precision), and the label's logit (0 where
    another rank holds it)."""
    probabilities = F.softmax(chunk, dim=-1, dtype=torch.float32)
    row_max = chunk.amax(dim=-1)  # without the argmax, which costs the CPU ten times as much
    shifted_lse = -probabilities.amax(dim=-1).log()  # the largest logit's probability
    target_logit = chunk.gather(-1, local_labels.unsqueeze(-1)).squeeze(-1).float().masked_fill(elsewhere, 0.0)
    return row_max.float(), shifted_lse, target_logit


def chunk_gradient(chunk, local_labels, elsewhere, row_scale, grad_loss, out):
    """Writes d loss / d logits of a chunk into `out` (the logits' dtype; may be the chunk itself): softmax times
    row_scale (this rank's share of the probability mass times the upstream gradient), minus the upstream gradient
    at the label. The label's entry is computed in fp32 before rounding: p is near 1 on a confident prediction."""
    probabilities = F.softmax(chunk, dim=-1, dtype=torch.float32)
    torch.mul(probabilities, row_scale.unsqueeze(-1), out=out)
    labels = local_labels.unsqueeze(-1)
    label_entry = probabilities.gather(-1, labels).squeeze(-1) * row_scale - grad_loss.masked_fill(elsewhere, 0.0)
    out.scatter_(-1, labels, label_entry.unsqueeze(-1).to(out.dtype))


@dataclass(frozen=True)
class ChunkKernels:
    """The per-chunk math, eager or through torch.compile (which fuses the fp32 conversions into the reductions:
    the logits are then only read, twice forward and three times backward, and the gradient written once)."""
    statistics: Callable = chunk_statistics
    gradient: Callable = chunk_gradient


EAGER_CHUNK_KERNELS = ChunkKernels()


def chunk_gradient_values(chunk, local_labels, elsewhere, row_scale, grad_loss):
    """chunk_gradient into a new tensor."""
    out = torch.empty_like(chunk)
    chunk_gradient(chunk, local_labels, elsewhere, row_scale, grad_loss, out)
    return out


def compiled_chunk_kernels() -> ChunkKernels:
    """The compiled gradient is written to a new tensor and copied into `out`: compiled with `out` itself, inductor
    read the chunk after writing over it where `out` was the chunk (the overwritten logits): wrong gradients."""
    values = torch.compile(chunk_gradient_values)

    def gradient(chunk, local_labels, elsewhere, row_scale, grad_loss, out):
        out.copy_(values(chunk, local_labels, elsewhere, row_scale, grad_loss))

    return ChunkKernels(torch.compile(chunk_statistics), gradient)


class _CrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, labels, group, rows_per_chunk, kernels, overwrite_logits):
        rows, local_vocab = logits.shape
        first_id = dist.get_rank(group) * local_vocab if group is not None else 0
        local_labels = labels - first_id
        elsewhere = (local_labels < 0) | (local_labels >= local_vocab)  # the label's logit is on another rank
        local_labels = local_labels.masked_fill(elsewhere, 0)

        per_chunk = []
        for start in range(0, rows, rows_per_chunk):
            chunk = slice(start, start + rows_per_chunk)
            per_chunk.append(kernels.statistics(logits[chunk], local_labels[chunk], elsewhere[chunk]))
        row_max, shifted_lse, target_logit = (torch.cat(parts) for parts in zip(*per_chunk))

        max_logit, log_sum = row_max, shifted_lse  # the whole vocabulary's, relative to its largest logit
        if group is not None:
            max_logit = row_max.clone()
            dist.all_reduce(max_logit, op=dist.ReduceOp.MAX, group=group)
            sums = torch.stack([(row_max - max_logit + shifted_lse).exp(), target_logit])
            dist.all_reduce(sums, group=group)  # exactly one rank holds each label's logit
            log_sum, target_logit = sums[0].log(), sums[1]
        ctx.rows_per_chunk, ctx.kernels, ctx.overwrite_logits = rows_per_chunk, kernels, overwrite_logits
        # log of this rank's share of the probability mass (0 with the whole vocabulary here)
        ctx.save_for_backward(logits, local_labels, elsewhere, row_max - max_logit + shifted_lse - log_sum)
        return (max_logit - target_logit) + log_sum

    @staticmethod
    def backward(ctx, grad_loss):
        logits, local_labels, elsewhere, log_share = ctx.saved_tensors
        row_scale = log_share.exp() * grad_loss  # the local softmax times the share is the whole vocabulary's
        grad_logits = logits if ctx.overwrite_logits else torch.empty_like(logits)
        for start in range(0, logits.shape[0], ctx.rows_per_chunk):
            chunk = slice(start, start + ctx.rows_per_chunk)
            ctx.kernels.gradient(logits[chunk], local_labels[chunk], elsewhere[chunk], row_scale[chunk],
                                 grad_loss[chunk], grad_logits[chunk])
        return grad_logits, None, None, None, None, None


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor, group: Optional[dist.ProcessGroup] = None,
                  chunk_bytes: int = CHUNK_BYTES, kernels: ChunkKernels = EAGER_CHUNK_KERNELS,
                  overwrite_logits: bool = False) -> torch.Tensor:
    """Per-token loss [..] in fp32 for logits [.., vocab] in any float dtype and labels [..] in [0, vocab).
    With `group`, the logits are this rank's slice of the vocabulary ([.., vocab / group size]), the labels
    index the whole padded vocabulary, and the loss is identical on every rank of the group. chunk_bytes
    bounds the fp32 temporaries (rows per chunk = chunk_bytes / (4 x local vocabulary)). With
    overwrite_logits, backward leaves the logits' gradient in the logits tensor itself: for logits that nothing
    else reads after backward (ignored for a leaf tensor, whose .grad the gradient would become)."""
    vocab = logits.shape[-1]
    overwrite_logits = overwrite_logits and not logits.is_leaf
    rows_per_chunk = max(1, chunk_bytes // (4 * vocab))
    losses = _CrossEntropy.apply(logits.reshape(-1, vocab), labels.reshape(-1), group, rows_per_chunk, kernels,
                                 overwrite_logits)
    return losses.view(labels.shape)
