"""Megatron's NullTokenizer (megatron/tokenizer/null_tokenizer.py): the text is the ids; the end-of-document id is
--vocab-size, one past the ids; anything else in the text, or a vocabulary size that is not a positive whole
number, is an InputError naming it."""
import pytest

from megatron.errors import InputError
from megatron.tokenizer import build_tokenizer
from megatron.tokenizer.null_tokenizer import NullTokenizer
from tests.helpers.tokenizer_texts import assert_batch_matches_single


def test_null_tokenizer():
    tokenizer = build_tokenizer("NullTokenizer", vocab_size=1000)
    assert isinstance(tokenizer, NullTokenizer) and tokenizer.vocab_size == 1001 and tokenizer.eod == 1000
    assert tokenizer.tokenize("5 17\n999\t0  1000") == [5, 17, 999, 0, 1000]
    assert tokenizer.detokenize([5, 17]) == "5 17"
    assert_batch_matches_single(tokenizer, ["1 2 3", "", "  ", "42"])


@pytest.mark.parametrize("text", ["1 two 3", "1001", "-1", "1.5"])
def test_null_tokenizer_rejects_non_ids(text):
    with pytest.raises(InputError, match="integer ids in 0..1000"):
        NullTokenizer(1000).tokenize(text)


@pytest.mark.parametrize("vocab_size", [None, 0, -3, "100", True])
def test_null_tokenizer_needs_positive_vocab_size(vocab_size):
    with pytest.raises(InputError, match="--vocab-size"):
        build_tokenizer("NullTokenizer", vocab_size=vocab_size)
