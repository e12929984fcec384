"""Running the zero-shot tasks over tensor x data parallelism, and their report lines.

Each data-parallel replica scores every DP-th window / example; the counts are summed over the data-parallel
group, so every rank ends with the totals. Tensor-parallel ranks of a replica run the same batches.
"""
import logging
from typing import List

import torch
import torch.distributed as dist

from megatron.evaluation.lambada import AccuracyResult, ClozeExample, example_batch
from megatron.evaluation.wikitext import PerplexityResult, count_words, detokenize_wikitext, sliding_windows, \
    window_batch
from megatron.inference.distributed import is_first_rank
from megatron.inference.generation import full_vocabulary_logits
from megatron.model.gpt import GPTModel

_log = logging.getLogger(__name__)


def _summed_over(values: List[float], group) -> List[float]:
    total = torch.tensor(values, dtype=torch.float64)
    if group is not None and dist.get_world_size(group) > 1:
        dist.all_reduce(total, group=group)
    return total.tolist()


def _batches(items: list, batch_size: int, data_parallel_rank: int, data_parallel_size: int):
    mine = items[data_parallel_rank::data_parallel_size]
    for first in range(0, len(mine), batch_size):
        if is_first_rank():
            _log.info("batch %d of %d of data-parallel rank 0", first // batch_size + 1, -(-len(mine) // batch_size))
        yield mine[first:first + batch_size]


@torch.no_grad()
def wikitext_perplexity(model: GPTModel, tokenizer, text: str, *, seq_length: int, overlapping_eval: int,
                        batch_size: int, data_parallel_rank: int = 0, data_parallel_size: int = 1,
                        data_parallel_group=None) -> PerplexityResult:
    """Loss of the detokenized text under the model, window by window (see wikitext.sliding_windows)."""
    tokens = list(tokenizer.tokenize(detokenize_wikitext(text)))
    windows = sliding_windows(tokens, seq_length, overlapping_eval)
    device = model.device
    summed_loss = 0.0
    for windows_batch in _batches(windows, batch_size, data_parallel_rank, data_parallel_size):
        inputs, labels, loss_mask = (tensor.to(device) for tensor in window_batch(windows_batch, tokenizer.eod))
        mean_loss = model(inputs, labels=labels, loss_mask=loss_mask)
        summed_loss += mean_loss.item() * loss_mask.sum().item()
    summed_loss, = _summed_over([summed_loss], data_parallel_group)
    return PerplexityResult(summed_loss, len(tokens), count_words(text))


@torch.no_grad()
def lambada_accuracy(model: GPTModel, examples: List[ClozeExample], *, vocab_size: int, pad_id: int,
                     batch_size: int, tensor_parallel_group=None, data_parallel_rank: int = 0,
                     data_parallel_size: int = 1, data_parallel_group=None) -> AccuracyResult:
    """How many examples have their whole target as the greedy choice at every target position."""
    device = model.device
    correct = 0
    for examples_batch in _batches(examples, batch_size, data_parallel_rank, data_parallel_size):
        inputs, target_mask, labels = (tensor.to(device) for tensor in example_batch(examples_batch, pad_id))
        logits = full_vocabulary_logits(model(inputs), tensor_parallel_group, vocab_size)
        wrong = (logits.argmax(dim=-1) != labels) & target_mask
        correct += int((~wrong.any(dim=-1)).sum())
    correct, = _summed_over([correct], data_parallel_group)
    return AccuracyResult(int(correct), len(examples))


def perplexity_report(task: str, result: PerplexityResult) -> str:
    """Upstream's result line for the language-modelling tasks."""
    return (f" validation results on {task} | avg loss: {result.average_loss:.4E} | ppl: {result.perplexity:.4E} | "
            f"adjusted ppl: {result.word_perplexity:.4E} | token ratio: {result.token_ratio} |")


def accuracy_report(task: str, result: AccuracyResult) -> str:
    """Upstream's result line for the cloze tasks."""
    return (f" validation results on {task} | number correct: {result.correct:.4E} | "
            f"total examples: {result.total:.4E} | avg accuracy: {result.accuracy:.4E}")
