"""WikiText-103 as a language-modelling task: undo the corpus's tokenization, cut the token stream into
(overlapping) windows, and convert the token-level loss into word-level perplexity.

WikiText's files are word-tokenized ("a @-@ b", "word , word"); GPT tokenizers expect running text, so the
spacing conventions are undone first. Word-level perplexity rescales the loss per token to a loss per
original (space-separated) word, which makes models with different tokenizers comparable.
"""
import math
import re
from dataclasses import dataclass
from typing import List

import torch

from megatron.errors import InputError

# (pattern, replacement) in the order applied; patterns are regular expressions.
_DETOKENIZATION_RULES = (
    (r"s '", "s'"),
    # numbers written with separated separators: 1 @,@ 000 / 3 @.@ 5 / well @-@ known
    (r" @-@ ", "-"), (r" @,@ ", ","), (r" @\.@ ", "."),
    # punctuation written as separate words
    (r" : ", ": "), (r" ; ", "; "), (r" \. ", ". "), (r" ! ", "! "), (r" \? ", "? "), (r" , ", ", "),
    # spaces inside brackets and quotes
    (r"\(\s*([^\)]*?)\s*\)", r"(\1)"), (r"\[\s*([^\]]*?)\s*\]", r"[\1]"), (r"{\s*([^}]*?)\s*}", r"{\1}"),
    (r"\"\s*([^\"]*?)\s*\"", r'"\1"'), (r"'\s*([^']*?)\s*'", r"'\1'"),
    # section headings "= = Title = =" and the degree sign
    (r"= = = =", "===="), (r"= = =", "==="), (r"= =", "=="), (" \u00b0 ", "\u00b0"),
    # spaces around line breaks, and the possessive
    (r" \n", "\n"), (r"\n ", "\n"), (r" 's", "'s"),
)


def detokenize_wikitext(text: str) -> str:
    for pattern, replacement in _DETOKENIZATION_RULES:
        text = re.sub(pattern, replacement, text)
    return text


def count_words(text: str) -> int:
    """Words of the original (tokenized) WikiText: the pieces between single spaces, as upstream counts them."""
    return len(text.strip().split(" "))


@dataclass(frozen=True)
class Window:
    tokens: List[int]  # up to seq_length + 1 tokens: inputs and next-token labels
    first_scored: int  # labels before this index were scored by the previous window


def sliding_windows(tokens: List[int], seq_length: int, overlapping_eval: int) -> List[Window]:
    """Windows of seq_length + 1 tokens starting every `overlapping_eval` tokens. The first scores all its
    labels; each later one only its last `overlapping_eval` (the rest it sees as context), so every token
    after the first is scored exactly once."""
    if not 1 <= overlapping_eval <= seq_length:
        raise InputError(f"--overlapping-eval {overlapping_eval} must be between 1 and --seq-length {seq_length}")
    if len(tokens) < 2:
        raise InputError("the evaluation text has fewer than 2 tokens: there is nothing to predict")
    count = max(1, math.ceil((len(tokens) - 1 - seq_length) / overlapping_eval) + 1)
    return [Window(tokens[start:start + seq_length + 1], 0 if start == 0 else seq_length - overlapping_eval)
            for start in (index * overlapping_eval for index in range(count))]


def window_batch(windows: List[Window], pad_id: int):
    """(inputs, labels, loss_mask) tensors [batch, longest window - 1]; padding is never scored."""
    width = max(len(window.tokens) for window in windows) - 1
    tokens = torch.full((len(windows), width + 1), pad_id, dtype=torch.long)
    loss_mask = torch.zeros((len(windows), width))
    for row, window in enumerate(windows):
        tokens[row, :len(window.tokens)] = torch.tensor(window.tokens)
        loss_mask[row, window.first_scored:len(window.tokens) - 1] = 1.0
    return tokens[:, :-1], tokens[:, 1:], loss_mask


@dataclass(frozen=True)
class PerplexityResult:
    summed_loss: float  # over every scored token
    tokens: int  # number of tokenized tokens of the text
    words: int  # number of original words

    @property
    def average_loss(self) -> float:
        return self.summed_loss / (self.tokens - 1)

    @property
    def token_ratio(self) -> float:
        return (self.tokens - 1) / max(1, self.words - 1)

    @property
    def perplexity(self) -> float:
        return math.exp(min(20.0, self.average_loss))

    @property
    def word_perplexity(self) -> float:
        """Upstream's "adjusted ppl": perplexity per original word."""
        return math.exp(min(20.0, self.average_loss * self.token_ratio))
