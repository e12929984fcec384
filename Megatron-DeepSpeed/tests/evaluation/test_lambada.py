"""LAMBADA's cloze examples (megatron/evaluation/lambada.py): the target split off as the last token or the last word,
the JSONL file read, and each way the file can be wrong as an InputError naming the line."""
import json

import pytest

from megatron.errors import InputError
from megatron.evaluation.lambada import ClozeExample, read_lambada, split_target
from megatron.tokenizer.null_tokenizer import NullTokenizer

TOKENIZER = NullTokenizer(95)  # ids 0..95, eod 95


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
