"""Tokenizers by their Megatron `--tokenizer-type` names, and the few helpers they share.

Every tokenizer offers `vocab_size`, `eod`, `tokenize`, `detokenize` and `tokenize_batch`; the engines
(tiktoken, sentencepiece, tokenizers) are imported only when a tokenizer of that kind is built, so importing this
package stays cheap.
"""
import numbers

import numpy as np

from megatron.errors import InputError

SENTENCEPIECE_TYPES = ("SentencePieceTokenizer", "GPTSentencePieceTokenizer")
HF_TOKENIZER_TYPE = "HFTokenizer"
TOKENIZER_TYPES = ("GPT2BPETokenizer",) + SENTENCEPIECE_TYPES + (HF_TOKENIZER_TYPE, "NullTokenizer")


def build_tokenizer(tokenizer_type, vocab_file=None, merge_file=None, tokenizer_model=None, vocab_size=None):
    """The tokenizer named by --tokenizer-type, built from the files/values of the matching flags."""
    if tokenizer_type == "GPT2BPETokenizer":
        from megatron.tokenizer.gpt2_bpe import GPT2BPETokenizer
        return GPT2BPETokenizer(_required(tokenizer_type, "--vocab-file", vocab_file),
                                _required(tokenizer_type, "--merge-file", merge_file))
    if tokenizer_type in SENTENCEPIECE_TYPES:
        from megatron.tokenizer.sentencepiece_tokenizer import SentencePieceTokenizer
        return SentencePieceTokenizer(_required(tokenizer_type, "--tokenizer-model", tokenizer_model))
    if tokenizer_type == HF_TOKENIZER_TYPE:
        from megatron.tokenizer.hf_tokenizer import HFTokenizer
        return HFTokenizer(_required(tokenizer_type, "--tokenizer-model", tokenizer_model))
    if tokenizer_type == "NullTokenizer":
        from megatron.tokenizer.null_tokenizer import NullTokenizer
        return NullTokenizer(_required(tokenizer_type, "--vocab-size", vocab_size))
    raise InputError(f"--tokenizer-type {tokenizer_type!r} is not supported; "
                     f"use one of: {', '.join(TOKENIZER_TYPES)}")


def vocab_size_with_padding(orig_vocab_size, make_vocab_size_divisible_by=128, tensor_model_parallel_size=1):
    """Embedding rows to allocate: the vocab padded so every tensor-parallel shard gets an equal slice
    whose size is a multiple of make_vocab_size_divisible_by (Megatron's rule)."""
    divisor = require_positive_int("--make-vocab-size-divisible-by", make_vocab_size_divisible_by)
    tp_size = require_positive_int("--tensor-model-parallel-size", tensor_model_parallel_size)
    multiple = divisor * tp_size
    return -(-orig_vocab_size // multiple) * multiple


def read_user_file(path, flag):
    """The bytes of a file the user named with `flag`, or an InputError that says which flag to fix."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as err:
        raise InputError(f"{flag} {path}: cannot read the file ({err.strerror or err}); "
                         f"pass the path of an existing, readable file") from None


def pack_token_arrays(arrays):
    """(all ids concatenated as int32, int64 length of each array): the tokenize_batch result.
    int32 holds every vocabulary id and halves the memory of int64 on the preprocessing hot path."""
    lengths = np.fromiter((len(a) for a in arrays), dtype=np.int64, count=len(arrays))
    if not arrays:
        return np.empty(0, dtype=np.int32), lengths
    return np.concatenate(arrays, dtype=np.int32, casting="same_kind"), lengths


def replace_lone_surrogates(text):
    """`text` made encodable as UTF-8: JSON may carry lone surrogate escapes ("\\ud800"), which the Rust
    and C++ engines reject; surrogate pairs are joined and lone ones become U+FFFD."""
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def require_positive_int(flag, value):
    """`value` as an int, or an InputError naming `flag` when it is not a positive integer."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise InputError(f"{flag} {value!r}: must be a positive integer")
    return int(value)


def _required(tokenizer_type, flag, value):
    if value is None:
        raise InputError(f"--tokenizer-type {tokenizer_type} needs {flag}; add {flag} to the command line")
    return value
