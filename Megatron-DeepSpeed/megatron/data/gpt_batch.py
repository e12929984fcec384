"""From dataset samples to model inputs: Megatron's get_batch and its left-to-right masks.

Samples hold seq_length + 1 tokens so that inputs and next-token labels are two shifted views of
one array. Documents are packed back to back; the reset flags decide whether a sample behaves as
one stream or as separate documents split at end-of-document tokens.
"""
import numpy as np
import torch


def collate(samples):
    """Stack the samples' "text" arrays into one [b, s+1] int64 tensor."""
    if not samples:
        raise ValueError("collate needs at least one sample")
    return torch.from_numpy(np.stack([np.asarray(sample["text"]) for sample in samples])).long()


def _document_starts(is_eod):
    """For every position, the index where its document starts: one past the last EOD before
    it (0 when none)."""
    batch, length = is_eod.shape
    after_eod = torch.zeros_like(is_eod)
    after_eod[:, 1:] = is_eod[:, :-1]
    positions = torch.arange(length).expand(batch, length)
    return torch.cummax(torch.where(after_eod, positions, 0), dim=1).values


def _segment_ids(is_eod):
    """[b, s] int64: the index of each position's document within its row, counting the EODs before it (an EOD
    belongs to the document it ends). Attention keeps each document to itself (model/attention_spec.py) without
    any [b, 1, s, s] mask."""
    return torch.cumsum(is_eod, dim=1) - is_eod.long()


def make_batch(text, eod, *, reset_position_ids=False, reset_attention_mask=False,
               eod_mask_loss=False):
    """Model inputs from a [b, s+1] token tensor: tokens, labels, loss_mask (float), position_ids
    and segment_ids (None when plain causal attention over the whole row is meant)."""
    if text.dim() != 2 or text.shape[1] < 2:
        raise ValueError(f"make_batch needs a [batch, seq_length + 1] tensor with "
                         f"seq_length >= 1, got shape {tuple(text.shape)}")
    text = text.long()
    tokens = text[:, :-1].contiguous()
    labels = text[:, 1:].contiguous()
    is_eod = tokens == eod

    loss_mask = torch.ones(tokens.shape, dtype=torch.float)
    if eod_mask_loss:
        loss_mask[is_eod] = 0.0

    position_ids = torch.arange(tokens.shape[1]).expand(tokens.shape)
    if reset_position_ids:
        position_ids = position_ids - _document_starts(is_eod)
    else:
        position_ids = position_ids.contiguous()

    segment_ids = _segment_ids(is_eod) if reset_attention_mask else None
    return {"tokens": tokens, "labels": labels, "loss_mask": loss_mask,
            "segment_ids": segment_ids, "position_ids": position_ids}


def model_inputs(batch: dict) -> dict:
    """GPTModel.forward's keyword inputs besides the tokens, from a batch of make_batch or any producer of the same
    keys (a batch without "segment_ids" is one stream per row)."""
    return {"position_ids": batch["position_ids"], "segment_ids": batch.get("segment_ids"),
            "labels": batch["labels"], "loss_mask": batch["loss_mask"]}


SEQUENCE_CHUNKED = ("tokens", "labels", "loss_mask", "position_ids")


def sequence_chunk(batch: dict, index: int, count: int) -> dict:
    """Chunk `index` of `count` equal chunks of each sequence, as upstream main's get_batch cuts it for
    DeepSpeed-Ulysses (model/ulysses.py): tokens, labels, loss mask and position ids (global positions) sliced;
    the segment ids, which the whole-sequence attention core reads, stay whole."""
    if count == 1:
        return batch
    length = batch["tokens"].shape[1] // count
    return {name: tensor[:, index * length:(index + 1) * length].contiguous() if name in SEQUENCE_CHUNKED else tensor
            for name, tensor in batch.items()}


def truncated_batch(batch, length):
    """Model inputs of make_batch cut to their first `length` positions (a sequence-length curriculum's batch, as
    upstream cuts it: the same tokens, labels, masks and positions, fewer of them)."""
    return {name: None if tensor is None else tensor[:, :length].contiguous() for name, tensor in batch.items()}


class BatchMaker:
    """A data loader's collate function that returns model inputs (make_batch of the stacked samples), so that
    with --num-workers > 0 the loader's worker processes build the batches ahead of the training step. With
    `sequence_chunk` (index, count), this rank's chunk of each sequence (DeepSpeed-Ulysses)."""

    def __init__(self, eod, *, reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False,
                 sequence_chunk=(0, 1)):
        self.eod = eod
        self.options = dict(reset_position_ids=reset_position_ids, reset_attention_mask=reset_attention_mask,
                            eod_mask_loss=eod_mask_loss)
        self.sequence_chunk = sequence_chunk

    def __call__(self, samples):
        return sequence_chunk(make_batch(collate(samples), self.eod, **self.options), *self.sequence_chunk)
