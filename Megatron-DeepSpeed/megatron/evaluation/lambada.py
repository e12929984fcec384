"""LAMBADA: predict the last word of a passage from the passage before it; accuracy counts the passages whose
whole target is the model's greedy choice at every target position.

Target, as upstream Megatron: the passage's last token (default), or with --strict-lambada its last
space-separated word, tokenized on its own with its leading space (which may take several tokens).
"""
import json
from dataclasses import dataclass
from typing import List

import torch

from megatron.errors import InputError
from megatron.files.user_json import read_text_lines


@dataclass(frozen=True)
class ClozeExample:
    context: List[int]
    target: List[int]

    @property
    def tokens(self) -> List[int]:
        return self.context + self.target


def split_target(tokenizer, text: str, strict: bool) -> ClozeExample:
    if not strict:
        tokens = list(tokenizer.tokenize(text))
        return ClozeExample(tokens[:-1], tokens[-1:])
    last_word = text.split()[-1]
    target = list(tokenizer.tokenize(" " + last_word))
    bos = getattr(tokenizer, "bos", None)  # a tokenizer that starts every text with BOS (HFTokenizer's Llama)
    return ClozeExample(list(tokenizer.tokenize(text[:text.rfind(last_word)].strip())),
                        target[1:] if bos is not None and target[:1] == [bos] else target)


def read_lambada(path: str, tokenizer, strict: bool, max_positions: int) -> List[ClozeExample]:
    """The examples of a LAMBADA JSONL file (one {"text": ...} per line; blank lines skipped)."""
    lines = read_text_lines(path, f"--valid-data {path}", "give LAMBADA's JSONL file")
    examples = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            text = json.loads(line)["text"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise InputError(f'--valid-data {path}, line {number}: expected a JSON object with a "text" field '
                             "(LAMBADA's JSONL format)") from None
        if not isinstance(text, str) or len(text.split()) < 2:
            raise InputError(f"--valid-data {path}, line {number}: the text needs at least two words (a context "
                             "and the word to predict)")
        example = split_target(tokenizer, text, strict)
        if not example.context or not example.target:
            raise InputError(f"--valid-data {path}, line {number}: tokenizes to nothing before or at the last word")
        if len(example.tokens) - 1 > max_positions:
            raise InputError(f"--valid-data {path}, line {number}: {len(example.tokens)} tokens do not fit the "
                             f"model's context of {max_positions} positions; shorten the passage")
        examples.append(example)
    if not examples:
        raise InputError(f"--valid-data {path} contains no examples")
    return examples


def example_batch(examples: List[ClozeExample], pad_id: int):
    """(inputs [batch, longest - 1], target_mask of the positions that must predict the target, labels)."""
    width = max(len(example.tokens) for example in examples) - 1
    tokens = torch.full((len(examples), width + 1), pad_id, dtype=torch.long)
    target_mask = torch.zeros((len(examples), width), dtype=torch.bool)
    for row, example in enumerate(examples):
        tokens[row, :len(example.tokens)] = torch.tensor(example.tokens)
        target_mask[row, len(example.context) - 1:len(example.tokens) - 1] = True
    return tokens[:, :-1], target_mask, tokens[:, 1:]


@dataclass(frozen=True)
class AccuracyResult:
    correct: int
    total: int

    @property
    def accuracy(self) -> float:
        return self.correct / self.total
