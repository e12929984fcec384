"""Fine-tuning batches: labels, the examples' loss mask, position ids restarting with each packed example and its
segment ids; a packed batch gives each example the loss and gradients it has alone (once attention honours the
segment ids)."""
import numpy as np
import pytest
import torch

from megatron.data.sft_batch import SFTBatchMaker, segment_positions
from megatron.data.sft_dataset import ExampleList, PackedExamples, PaddedExamples, padded_sample
from megatron.data.sft_examples import Example
from megatron.model.gpt import GPTConfig, GPTModel

LIMIT = 17  # 16 inputs a sample


def examples() -> ExampleList:
    rng = np.random.default_rng(0)
    return ExampleList(Example.of(rng.integers(3, 60, length), np.arange(length) >= prompt)
                       for length, prompt in ((6, 3), (5, 2), (4, 1), (7, 4), (9, 5)))


def test_segment_positions_restart_with_each_segment():
    segments = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2], [0, 1, 1, 1, 1, 1, 2, 3]])
    assert segment_positions(segments).tolist() == [[0, 1, 2, 0, 1, 0, 1, 2], [0, 0, 1, 2, 3, 4, 0, 0]]


def test_a_packed_batch_has_segments_restarting_positions_and_only_answers_as_targets():
    dataset = PackedExamples(examples(), LIMIT, pad=0, num_samples=2)
    batch = SFTBatchMaker(packed=True)([dataset[0], dataset[1]])
    first = dataset[0]
    assert batch["tokens"][0].tolist() == first["text"][:-1].tolist()
    assert batch["labels"][0].tolist() == first["text"][1:].tolist()
    assert batch["loss_mask"][0].tolist() == first["loss_mask"][1:].astype(float).tolist()
    assert batch["segment_ids"][0].tolist() == [0] * 6 + [1] * 5 + [2] * 4 + [3]  # the last: padding
    assert batch["position_ids"][0].tolist() == [*range(6), *range(5), *range(4), 0]
    assert batch["attention_mask"] is None and batch["loss_mask"].dtype == torch.float32
    # no example's first token is a target: the label that crosses into the next example is never trained on
    assert batch["loss_mask"][0, 5].item() == 0 and batch["loss_mask"][0, 10].item() == 0


def test_a_padded_batch_is_one_example_a_row_with_plain_positions():
    dataset = PaddedExamples(examples(), LIMIT, pad=0, num_samples=5)
    batch = SFTBatchMaker(packed=False)([dataset[0]])
    assert "segment_ids" not in batch and batch["position_ids"][0].tolist() == list(range(16))
    assert batch["loss_mask"][0].tolist() == [0, 0, 1, 1, 1] + [0] * 11


def tiny_llama() -> GPTModel:
    torch.manual_seed(0)
    return GPTModel(GPTConfig(vocab_size=64, max_position_embeddings=32, num_layers=2, hidden_size=32,
                              num_attention_heads=4, num_key_value_heads=2, ffn_hidden_size=48, hidden_dropout=0.0,
                              attention_dropout=0.0, normalization="rmsnorm", add_position_embedding=False,
                              use_rotary_position_embeddings=True, swiglu=True, add_bias_linear=False,
                              untie_embeddings_and_output_weights=True))


def loss_and_gradients(model: GPTModel, batch: dict, loss_mask: torch.Tensor) -> tuple:
    model.zero_grad()
    loss = model(batch["tokens"], position_ids=batch["position_ids"], segment_ids=batch.get("segment_ids"),
                 labels=batch["labels"], loss_mask=loss_mask)
    loss.backward()
    return loss.item(), {name: parameter.grad.clone() for name, parameter in model.named_parameters()}


def test_packed_equals_unpacked_per_example_loss_and_gradients():
    """Each example's loss and gradients from the packed row (its targets alone in the mask) equal those of the
    example padded alone, fp32, to 1e-5."""
    model, rows = tiny_llama(), examples()[:3]
    packed = SFTBatchMaker(packed=True)([padded_sample(rows, LIMIT, 0)])
    for number, example in enumerate(rows):
        alone = SFTBatchMaker(packed=False)([padded_sample([example], LIMIT, 0)])
        expected_loss, expected_gradients = loss_and_gradients(model, alone, alone["loss_mask"])
        own = packed["loss_mask"] * (packed["segment_ids"] == number)
        loss, gradients = loss_and_gradients(model, packed, own)
        assert loss == pytest.approx(expected_loss, rel=1e-5)
        for name, gradient in gradients.items():
            torch.testing.assert_close(gradient, expected_gradients[name], rtol=1e-5, atol=1e-6, msg=name)
