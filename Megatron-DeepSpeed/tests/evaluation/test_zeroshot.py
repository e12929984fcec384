"""Zero-shot evaluation on in-memory models (megatron/evaluation/zeroshot.py): WikiText perplexity gives the loss a
token-by-token computation gives; LAMBADA accuracy agrees with greedy generation. The windows, the detokenizer and
the cloze files: test_wikitext.py, test_lambada.py."""
import math

import pytest
import torch
import torch.nn.functional as F

from megatron.evaluation.lambada import ClozeExample
from megatron.evaluation.zeroshot import accuracy_report, lambada_accuracy, wikitext_perplexity
from megatron.inference.generation import generate_batch
from megatron.inference.sampling import SamplingParams
from megatron.model.gpt import GPTConfig, GPTModel
from megatron.tokenizer.null_tokenizer import NullTokenizer

TOKENIZER = NullTokenizer(95)  # ids 0..95, eod 95
MODEL = dict(vocab_size=128, max_position_embeddings=32, num_layers=2, hidden_size=32, num_attention_heads=4,
             ffn_hidden_size=64, hidden_dropout=0.0, attention_dropout=0.0, init_method_std=0.3)


@pytest.fixture(scope="module")
def model():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny model: threads only contend on a busy machine
    yield GPTModel(GPTConfig(**MODEL, init_seed=5)).eval()
    torch.set_num_threads(threads)


def token_by_token_loss(model, tokens, seq_length, overlap):
    """The oracle: each token's loss given the context its scoring window shows, one forward per token."""
    total = 0.0
    for target in range(1, len(tokens)):
        window = max(0, math.ceil((target - seq_length) / overlap))
        context = torch.tensor([tokens[window * overlap:target]])
        with torch.no_grad():
            total += F.cross_entropy(model(context)[0, -1], torch.tensor(tokens[target])).item()
    return total


@pytest.mark.parametrize("overlap", [16, 6])
def test_wikitext_loss_equals_the_token_by_token_oracle(model, overlap):
    words = [str((7 * i) % 90) for i in range(45)]
    text = " ".join(words)
    result = wikitext_perplexity(model, TOKENIZER, text, seq_length=16, overlapping_eval=overlap, batch_size=2)
    assert (result.tokens, result.words) == (45, 45)
    tokens = [int(word) for word in words]
    assert result.summed_loss == pytest.approx(token_by_token_loss(model, tokens, 16, overlap), rel=1e-5)
    assert result.perplexity == pytest.approx(math.exp(result.summed_loss / 44))


def test_lambada_accuracy_agrees_with_greedy_generation(model):
    examples = [ClozeExample(context=[(3 * i + j) % 90 for j in range(2 + i % 5)], target=[(5 * i) % 90])
                for i in range(12)]
    # Make half the targets the model's own greedy continuation (of one or two tokens), so both outcomes occur.
    for example in examples[::2]:
        example.target[:] = generate_batch(model, [example.context], 1 + len(example.context) % 2, SamplingParams(),
                                           [None], None, TOKENIZER.vocab_size)[0]
    expected = sum(generate_batch(model, [e.context], len(e.target), SamplingParams(), [None], None,
                                  TOKENIZER.vocab_size)[0] == e.target for e in examples)
    result = lambada_accuracy(model, examples, vocab_size=TOKENIZER.vocab_size, pad_id=TOKENIZER.eod, batch_size=5)
    assert (result.correct, result.total) == (expected, 12)
    assert 6 <= expected < 12
    assert accuracy_report("LAMBADA", result).startswith(
        f" validation results on LAMBADA | number correct: {float(expected):.4E} | total examples: 1.2000E+01 |")
