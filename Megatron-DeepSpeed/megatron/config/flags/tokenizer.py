"""Tokenizer flags (GPT-2 BPE, SentencePiece, Hugging Face or Null); the files they need, and the TokenizerConfig section.
Generation and evaluation register the same flags with no defaults: what is not given is taken from the
checkpoint (megatron/inference/loading.py)."""
import os
from typing import Mapping

from megatron.config.flags.common import Limits, flag, same_named
from megatron.config.job import TokenizerConfig
from megatron.errors import InputError
from megatron.tokenizer import HF_TOKENIZER_TYPE, SENTENCEPIECE_TYPES, TOKENIZER_TYPES

LIMITS = Limits(positive=("vocab_size",))
_AS_TRAINED = " Default: as the model was trained."


def add_flags(parser, as_trained: bool = False) -> None:
    """as_trained: no defaults (generation and evaluation take the checkpoint's)."""
    suffix = _AS_TRAINED if as_trained else ""
    group = parser.add_argument_group("tokenizer")
    group.add_argument("--tokenizer-type", choices=TOKENIZER_TYPES, default=None if as_trained else "GPT2BPETokenizer",
                       help="Which tokenizer." + suffix)
    group.add_argument("--vocab-file", help="GPT-2 vocab.json." + suffix)
    group.add_argument("--merge-file", help="GPT-2 merges.txt." + suffix)
    group.add_argument("--tokenizer-model", help="SentencePiece model file; for HFTokenizer a Hugging Face "
                                                 "tokenizer directory or its tokenizer.json." + suffix)
    group.add_argument("--vocab-size", type=int, help="Vocabulary size for NullTokenizer." + suffix)


def _check_file(values: Mapping, dest: str, what: str) -> None:
    value = values[dest]
    if value is None:
        raise InputError(f"--tokenizer-type {values['tokenizer_type']} needs {flag(dest)}; give the "
                         f"path of {what}")
    if not os.path.isfile(value):
        raise InputError(f"{flag(dest)} {value} does not exist; give the path of {what}")


def validate(values: Mapping) -> None:
    kind = values["tokenizer_type"]
    if kind == "GPT2BPETokenizer":
        _check_file(values, "vocab_file", "GPT-2's vocab.json")
        _check_file(values, "merge_file", "GPT-2's merges.txt")
    elif kind in SENTENCEPIECE_TYPES:
        _check_file(values, "tokenizer_model", "a SentencePiece .model file")
    elif kind == HF_TOKENIZER_TYPE:
        if values["tokenizer_model"] is None:
            raise InputError("--tokenizer-type HFTokenizer needs --tokenizer-model; give a Hugging Face tokenizer "
                             "directory or its tokenizer.json")
        if not os.path.exists(values["tokenizer_model"]):
            raise InputError(f"--tokenizer-model {values['tokenizer_model']} does not exist; give a Hugging Face "
                             "tokenizer directory or its tokenizer.json")
    elif values["vocab_size"] is None:
        raise InputError("--tokenizer-type NullTokenizer needs --vocab-size N")


def section(values: Mapping) -> TokenizerConfig:
    return same_named(TokenizerConfig, values)
