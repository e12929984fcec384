"""Fine-tuning samples (sft_dataset) to model inputs: the keys of gpt_batch.make_batch, the loss mask the examples'
own, and for packed samples the segment ids.

A packed batch carries "segment_ids" ([b, s] int64, non-decreasing along a row: the example each input token
belongs to), position ids restarting at 0 with each example, and no attention mask: attention keeps each token
to its own segment (causally) from the segment ids, without an s x s mask. A padded batch is one example per row,
plain causal attention, positions from 0.
"""
import numpy as np
import torch

from megatron.data.gpt_batch import sequence_chunk


def collate_samples(samples: list, key: str) -> torch.Tensor:
    return torch.from_numpy(np.stack([np.asarray(sample[key]) for sample in samples])).long()


def segment_positions(segment_ids: torch.Tensor) -> torch.Tensor:
    """Each token's position within its segment: 0 at every segment's first token."""
    length = segment_ids.shape[1]
    positions = torch.arange(length).expand_as(segment_ids)
    starts = torch.ones_like(segment_ids, dtype=torch.bool)
    starts[:, 1:] = segment_ids[:, 1:] != segment_ids[:, :-1]
    return positions - torch.cummax(torch.where(starts, positions, 0), dim=1).values


def make_sft_batch(text: torch.Tensor, loss_mask: torch.Tensor, segment_ids=None) -> dict:
    """Model inputs from [b, s+1] tokens, their 0/1 target mask and (packed) their segment ids."""
    tokens, labels = text[:, :-1].contiguous(), text[:, 1:].contiguous()
    batch = {"tokens": tokens, "labels": labels, "loss_mask": loss_mask[:, 1:].float().contiguous(),
             "attention_mask": None}
    if segment_ids is None:
        batch["position_ids"] = torch.arange(tokens.shape[1]).expand(tokens.shape).contiguous()
    else:
        batch["segment_ids"] = segment_ids[:, :-1].contiguous()
        batch["position_ids"] = segment_positions(batch["segment_ids"])
    return batch


class SFTBatchMaker:
    """A data loader's collate function for fine-tuning samples (see gpt_batch.BatchMaker): packed samples keep
    their segment ids, padded ones are plain causal rows."""

    def __init__(self, packed: bool, sequence_chunk=(0, 1)):
        self.packed, self.sequence_chunk = packed, sequence_chunk

    def __call__(self, samples: list) -> dict:
        segments = collate_samples(samples, "segment_ids") if self.packed else None
        batch = make_sft_batch(collate_samples(samples, "text"), collate_samples(samples, "loss_mask"), segments)
        return sequence_chunk(batch, *self.sequence_chunk)
