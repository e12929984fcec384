"""Zero-shot evaluation on in-memory models: WikiText windows score every token once and give the loss a
token-by-token computation gives; LAMBADA accuracy agrees with greedy generation; the corpus detokenizer,
word-level perplexity and input errors."""
import json
import math

import pytest
import torch
import torch.nn.functional as F

from megatron.errors import InputError
from megatron.evaluation.lambada import ClozeExample, read_lambada, split_target
from megatron.evaluation.wikitext import PerplexityResult, count_words, detokenize_wikitext, sliding_windows
from megatron.evaluation.zeroshot import accuracy_report, lambada_accuracy, perplexity_report, wikitext_perplexity
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


@pytest.mark.parametrize("tokens, seq_length, overlap", [(41, 16, 16), (41, 16, 5), (41, 16, 1), (10, 16, 4),
                                                         (17, 16, 16), (18, 16, 16), (2, 4, 2)])
def test_every_token_after_the_first_is_scored_exactly_once(tokens, seq_length, overlap):
    scored = []
    windows = sliding_windows(list(range(tokens)), seq_length, overlap)
    for window in windows:
        assert len(window.tokens) <= seq_length + 1
        scored += window.tokens[1 + window.first_scored:]  # the labels each window scores
    assert scored == list(range(1, tokens))
    assert len(windows) == max(1, math.ceil((tokens - 1 - seq_length) / overlap) + 1)


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


def test_word_level_perplexity_and_report():
    result = PerplexityResult(summed_loss=30.0, tokens=21, words=11)  # 20 predicted tokens for 10 words
    assert result.average_loss == 1.5
    assert result.token_ratio == 2.0
    assert result.perplexity == pytest.approx(math.exp(1.5))
    assert result.word_perplexity == pytest.approx(math.exp(3.0))
    assert perplexity_report("WIKITEXT103", result) == (
        " validation results on WIKITEXT103 | avg loss: 1.5000E+00 | ppl: 4.4817E+00 | adjusted ppl: 2.0086E+01 | "
        "token ratio: 2.0 |")


def test_wikitext_detokenizer():
    raw = (" = = Early life = = \n The 1 @,@ 000 @-@ year old , well @-@ known ( in 1 @.@ 5 \" days \" ) ; "
           "it 's John 's . \n")
    assert detokenize_wikitext(raw) == (" == Early life ==\nThe 1,000-year old, well-known (in 1.5 \"days\"); "
                                        "it's John's.\n")
    assert count_words(raw) == len(raw.strip().split(" "))


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


def test_lambada_targets_last_token_or_strict_last_word(tmp_path):
    assert split_target(TOKENIZER, "4 5 6 7", strict=False) == ClozeExample([4, 5, 6], [7])
    assert split_target(TOKENIZER, "4 5 6  7 ", strict=True) == ClozeExample([4, 5, 6], [7])
    path = tmp_path / "lambada.jsonl"
    path.write_text(json.dumps({"text": "1 2 3"}) + "\n\n" + json.dumps({"text": "9 8"}) + "\n")
    assert read_lambada(str(path), TOKENIZER, strict=True, max_positions=8) == [ClozeExample([1, 2], [3]),
                                                                                ClozeExample([9], [8])]


@pytest.mark.parametrize("content, message", [
    ("", "contains no examples"), ('{"text": "1 2"}\n{"txt": "1 2"}\n', 'line 2: expected a JSON object with a "text"'),
    ('{"text": "1"}\n', "line 1: the text needs at least two words"),
    ('{"text": "' + " ".join(["1"] * 10) + '"}\n', "line 1: 10 tokens do not fit the model's context of 8")])
def test_bad_lambada_files(tmp_path, content, message):
    path = tmp_path / "lambada.jsonl"
    path.write_text(content)
    with pytest.raises(InputError, match=message):
        read_lambada(str(path), TOKENIZER, strict=False, max_positions=8)


def test_bad_window_flags():
    with pytest.raises(InputError, match="--overlapping-eval 20 must be between 1 and --seq-length 16"):
        sliding_windows(list(range(40)), 16, 20)
    with pytest.raises(InputError, match="fewer than 2 tokens"):
        sliding_windows([1], 16, 16)
