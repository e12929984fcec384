"""WikiText's pieces (megatron/evaluation/wikitext.py): windows that score every token after the first exactly once,
word-level perplexity, the corpus detokenizer, and window flags that cannot work as one line."""
import math

import pytest

from megatron.errors import InputError
from megatron.evaluation.wikitext import PerplexityResult, count_words, detokenize_wikitext, sliding_windows
from megatron.evaluation.zeroshot import perplexity_report


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


def test_bad_window_flags():
    with pytest.raises(InputError, match="--overlapping-eval 20 must be between 1 and --seq-length 16"):
        sliding_windows(list(range(40)), 16, 20)
    with pytest.raises(InputError, match="fewer than 2 tokens"):
        sliding_windows([1], 16, 16)
