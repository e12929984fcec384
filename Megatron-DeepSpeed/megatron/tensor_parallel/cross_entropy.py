"""Cross entropy over logits whose vocabulary is split across tensor-parallel ranks, without gathering them.

Each rank holds logits for its slice of the PADDED vocabulary. Three all-reduces of [batch, seq] tensors
(the max, the target logit, the sum of exponentials) give every rank the exact per-token loss; the gradient
(softmax minus one-hot) needs no communication because each rank owns its slice of it.
"""
import torch
import torch.distributed as dist


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, labels, group):
        local_vocab = logits.shape[-1]
        local_labels = labels - dist.get_rank(group) * local_vocab
        elsewhere = (local_labels < 0) | (local_labels >= local_vocab)
        local_labels = local_labels.masked_fill(elsewhere, 0)

        # Subtract the global max before exponentiating, so large logits cannot overflow.
        global_max = logits.max(dim=-1).values
        dist.all_reduce(global_max, op=dist.ReduceOp.MAX, group=group)
        shifted = logits - global_max.unsqueeze(-1)

        target_logit = shifted.gather(-1, local_labels.unsqueeze(-1)).squeeze(-1).masked_fill(elsewhere, 0.0)
        dist.all_reduce(target_logit, group=group)  # exactly one rank holds each label
        exp_logits = shifted.exp()
        sum_exp = exp_logits.sum(dim=-1)
        dist.all_reduce(sum_exp, group=group)

        ctx.save_for_backward(exp_logits.div_(sum_exp.unsqueeze(-1)), local_labels, elsewhere)
        return sum_exp.log() - target_logit

    @staticmethod
    def backward(ctx, grad_loss):
        softmax, local_labels, elsewhere = ctx.saved_tensors
        one_hot_here = (~elsewhere).to(softmax.dtype).unsqueeze(-1)
        grad_logits = softmax.scatter_add(-1, local_labels.unsqueeze(-1), -one_hot_here)
        return grad_logits.mul_(grad_loss.unsqueeze(-1)), None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, group) -> torch.Tensor:
    """Per-token loss [..] (fp32) for vocab-split logits [.., local_vocab] and labels [..] in [0, padded vocab);
    identical on every rank of `group`. Computed in fp32 whatever the logits' dtype."""
    return _VocabParallelCrossEntropy.apply(logits.float(), labels, group)
