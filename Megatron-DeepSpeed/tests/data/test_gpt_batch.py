"""Model inputs from samples: shifted tokens/labels, loss mask, position ids and the
cross-document attention mask, checked on a hand-written example and against Megatron's loop."""
import pickle

import numpy as np
import pytest
import torch

from megatron.data.gpt_batch import BatchMaker, collate, make_batch, model_inputs, sequence_chunk
from megatron.model.attention_spec import AttentionSpec

EOD = 0
# Tokens (the first 7) hold EODs at positions 1 and 4: documents {0, 1}, {2, 3, 4}, {5, 6}.
TWO_EODS = [5, EOD, 6, 7, EOD, 8, 9, 3]
NO_EOD = [1, 2, 3, 4, 5, 6, 7, 8]
TEXT = torch.tensor([TWO_EODS, NO_EOD])

# 1 = the query (row) may attend to the key (column), as in Megatron's float mask before `< 0.5`.
MAY_ATTEND_TWO_EODS = [
    [1, 0, 0, 0, 0, 0, 0],
    [1, 1, 0, 0, 0, 0, 0],
    [0, 0, 1, 0, 0, 0, 0],
    [0, 0, 1, 1, 0, 0, 0],
    [0, 0, 1, 1, 1, 0, 0],
    [0, 0, 0, 0, 0, 1, 0],
    [0, 0, 0, 0, 0, 1, 1],
]
MAY_ATTEND_CAUSAL = [[1 if key <= query else 0 for key in range(7)] for query in range(7)]


def test_tokens_and_labels_are_the_two_shifted_views():
    batch = make_batch(TEXT, EOD)
    assert batch["tokens"].tolist() == [TWO_EODS[:-1], NO_EOD[:-1]]
    assert batch["labels"].tolist() == [TWO_EODS[1:], NO_EOD[1:]]
    assert batch["tokens"].dtype == batch["labels"].dtype == torch.int64


def test_defaults_mean_one_causal_stream():
    batch = make_batch(TEXT, EOD)
    assert batch["segment_ids"] is None
    assert batch["position_ids"].tolist() == [list(range(7))] * 2
    assert batch["loss_mask"].dtype == torch.float32
    assert batch["loss_mask"].tolist() == [[1.0] * 7] * 2


def test_eod_mask_loss_zeroes_the_eod_positions():
    batch = make_batch(TEXT, EOD, eod_mask_loss=True)
    assert batch["loss_mask"].tolist() == [[1, 0, 1, 1, 0, 1, 1], [1] * 7]


def test_reset_position_ids_restarts_after_each_eod():
    batch = make_batch(TEXT, EOD, reset_position_ids=True)
    assert batch["position_ids"].tolist() == [[0, 1, 0, 1, 2, 0, 1], list(range(7))]
    assert batch["segment_ids"] is None


def may_not_attend(segment_ids):
    """The [b, 1, s, s] mask (True = may not attend) the attention kernels make of the batch's segment ids."""
    return ~AttentionSpec(segment_ids=segment_ids).allowed(segment_ids.shape[1], segment_ids.shape[1], "cpu")


def test_reset_attention_mask_blocks_attention_across_documents():
    segment_ids = make_batch(TEXT, EOD, reset_attention_mask=True)["segment_ids"]
    # One document index per token (an EOD in the document it ends), never a [b, 1, s, s] tensor.
    assert segment_ids.dtype == torch.int64 and segment_ids.tolist() == [[0, 0, 1, 1, 1, 2, 2], [0] * 7]
    expected = torch.tensor([[MAY_ATTEND_TWO_EODS], [MAY_ATTEND_CAUSAL]], dtype=torch.float)
    assert torch.equal(may_not_attend(segment_ids), expected < 0.5)
    # Reset attention alone leaves the position ids running.
    assert make_batch(TEXT, EOD, reset_attention_mask=True)["position_ids"].tolist()[0] == \
        list(range(7))


def megatron_loop(tokens, eod, reset_position_ids, reset_attention_mask):
    """Megatron's per-EOD loop, written out: zero the block below-left of each EOD, and shift
    the following positions back by the finished document's length."""
    batch, length = tokens.shape
    may_attend = torch.ones(batch, 1, length, length).tril()
    positions = torch.arange(length).repeat(batch, 1)
    for row in range(batch):
        previous_start = 0
        for eod_at in (tokens[row] == eod).nonzero().flatten().tolist():
            if reset_attention_mask:
                may_attend[row, 0, eod_at + 1:, :eod_at + 1] = 0
            if reset_position_ids:
                positions[row, eod_at + 1:] -= eod_at + 1 - previous_start
                previous_start = eod_at + 1
    return may_attend < 0.5, positions


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_megatrons_loop_on_random_documents(seed):
    generator = torch.Generator().manual_seed(seed)
    # Ids 0..3 with EOD = 0: about one token in four ends a document, including runs of EODs
    # and EODs at the first and last positions.
    text = torch.randint(0, 4, (3, 17), generator=generator)
    text[0, 0] = text[1, 15] = EOD
    batch = make_batch(text, EOD, reset_position_ids=True, reset_attention_mask=True)
    mask, positions = megatron_loop(text[:, :-1], EOD, True, True)
    assert torch.equal(may_not_attend(batch["segment_ids"]), mask)
    assert torch.equal(batch["position_ids"], positions)


def test_rejects_a_tensor_that_is_not_a_batch_of_samples():
    with pytest.raises(ValueError, match=r"got shape \(8,\)"):
        make_batch(torch.arange(8), EOD)
    with pytest.raises(ValueError, match=r"got shape \(2, 1\)"):
        make_batch(torch.zeros(2, 1, dtype=torch.long), EOD)


def test_collate_stacks_the_text_arrays():
    samples = [{"text": np.array(TWO_EODS, dtype=np.int64)},
               {"text": np.array(NO_EOD, dtype=np.uint16)}]
    text = collate(samples)
    assert text.dtype == torch.int64
    assert torch.equal(text, TEXT)


def test_collate_needs_samples_of_one_length():
    with pytest.raises(ValueError):
        collate([{"text": np.zeros(4)}, {"text": np.zeros(5)}])
    with pytest.raises(ValueError, match="at least one sample"):
        collate([])


def test_the_loaders_batch_maker_is_make_batch_of_the_stacked_samples():
    samples = [{"text": row.numpy()} for row in TEXT]
    maker = pickle.loads(pickle.dumps(BatchMaker(EOD, reset_position_ids=True, eod_mask_loss=True)))  # to workers
    made, expected = maker(samples), make_batch(TEXT, EOD, reset_position_ids=True, eod_mask_loss=True)
    assert made.keys() == expected.keys() and made["segment_ids"] is None
    for name in ("tokens", "labels", "loss_mask", "position_ids"):
        assert torch.equal(made[name], expected[name]), name


def test_a_ulysses_chunk_cuts_the_tokens_and_keeps_the_segment_ids_whole():
    text = torch.tensor([[1, 2, EOD, 3, 4, 5, EOD, 6, 7]])
    whole = make_batch(text, EOD, reset_position_ids=True, reset_attention_mask=True)
    second = sequence_chunk(whole, 1, 2)
    for name in ("tokens", "labels", "loss_mask", "position_ids"):
        assert torch.equal(second[name], whole[name][:, 4:]), name
    assert second["segment_ids"] is whole["segment_ids"]  # the attention core attends over the whole sequence
    assert second["position_ids"].tolist() == [[1, 2, 3, 0]]


def test_model_inputs_read_a_batch_without_segment_ids_as_one_stream():
    batch = make_batch(TEXT, EOD)
    del batch["segment_ids"]  # another producer's batch (e.g. fine-tuning's) may leave the key out
    assert model_inputs(batch)["segment_ids"] is None and model_inputs(batch)["labels"] is batch["labels"]
