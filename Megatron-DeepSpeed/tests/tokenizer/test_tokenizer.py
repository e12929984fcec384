"""The tokenizer package (megatron/tokenizer/__init__.py): build_tokenizer's refusal of an unknown type and
Megatron's vocabulary padding (a multiple of --make-vocab-size-divisible-by x --tensor-model-parallel-size). Each
tokenizer: its own test file."""
import pytest

from megatron.errors import InputError
from megatron.tokenizer import build_tokenizer, vocab_size_with_padding


def test_unknown_tokenizer_type():
    with pytest.raises(InputError, match="--tokenizer-type 'BertWordPieceLowerCase' is not supported"):
        build_tokenizer("BertWordPieceLowerCase", vocab_file="vocab.txt")


@pytest.mark.parametrize("orig, divisible_by, tp, expected", [
    (50257, 128, 1, 50304),   # 128 * 393
    (50257, 128, 2, 50432),   # 256 * 197
    (50257, 128, 4, 50688),   # 512 * 99
    (50257, 128, 8, 51200),   # 1024 * 50
    (50304, 128, 1, 50304),   # already a multiple
    (1201, 1, 1, 1201),
    (1201, 64, 3, 1344),      # 192 * 7
])
def test_vocab_size_with_padding(orig, divisible_by, tp, expected):
    assert vocab_size_with_padding(orig, divisible_by, tp) == expected


def test_vocab_size_with_padding_rejects_bad_flags():
    with pytest.raises(InputError, match="--make-vocab-size-divisible-by 0"):
        vocab_size_with_padding(50257, 0, 1)
    with pytest.raises(InputError, match="--tensor-model-parallel-size -2"):
        vocab_size_with_padding(50257, 128, -2)
