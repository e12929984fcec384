"""Hugging Face tokenizers (--tokenizer-type HFTokenizer, upstream main's name) from a local tokenizer.json through
the `tokenizers` library: no network and no transformers. The ids are those Tokenizer.encode gives (with the
special tokens its post-processor adds, e.g. Llama's BOS); the end of document is the eos_token of
tokenizer_config.json beside it (transformers' file for the special tokens), else the `</s>`, `<|endoftext|>` or
`<|end_of_text|>` token the vocabulary holds. The pad token is tokenizer_config.json's pad_token (None without one:
fine-tuning pads with the end of document then, megatron/data/sft_dataset.py says why that loses nothing). Chat
templates are transformers' (`chat_template_tokenizer`), the one use of transformers here."""
import json
import os
from typing import List, Optional

from megatron.errors import InputError
from megatron.tokenizer import pack_token_arrays, replace_lone_surrogates

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_FILE = "special_tokens_map.json"
COMMON_EODS = ("</s>", "<|endoftext|>", "<|end_of_text|>")


def tokenizer_json_path(path: str) -> str:
    """The tokenizer.json that --tokenizer-model names (the file, or the one in the directory)."""
    candidate = os.path.join(path, TOKENIZER_FILE) if os.path.isdir(path) else path
    if not os.path.isfile(candidate):
        raise InputError(f"--tokenizer-model {path}: no {TOKENIZER_FILE} there; give a Hugging Face tokenizer "
                         f"directory or its {TOKENIZER_FILE}")
    return candidate


def hf_tokenizer_files(path: str) -> List[str]:
    """tokenizer.json and, where present beside it, tokenizer_config.json and special_tokens_map.json."""
    tokenizer_file = tokenizer_json_path(path)
    directory = os.path.dirname(tokenizer_file)
    beside = [os.path.join(directory, name) for name in (CONFIG_FILE, SPECIAL_TOKENS_FILE)]
    return [tokenizer_file, *(name for name in beside if os.path.isfile(name))]


def _token_text(value) -> Optional[str]:
    """A special token as tokenizer_config.json writes it: a string or {"content": string, ...}."""
    return value.get("content") if isinstance(value, dict) else value


def _special_tokens(directory: str) -> dict:
    path = os.path.join(directory, CONFIG_FILE)
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as handle:
            config = json.load(handle)
    except (OSError, ValueError) as err:
        raise InputError(f"{path} cannot be read as JSON ({err}); fix or remove it") from None
    return {key: _token_text(config.get(key)) for key in ("bos_token", "eos_token", "pad_token") if config.get(key)}


class HFTokenizer:
    def __init__(self, path: str):
        from tokenizers import Tokenizer
        tokenizer_file = tokenizer_json_path(path)
        try:
            self._tokenizer = Tokenizer.from_file(tokenizer_file)
        except Exception as err:  # tokenizers raises a bare Exception for a malformed file
            raise InputError(f"--tokenizer-model {tokenizer_file}: not a Hugging Face tokenizer.json ({err})") from None
        self.vocab_size = self._tokenizer.get_vocab_size(with_added_tokens=True)
        special = _special_tokens(os.path.dirname(tokenizer_file))
        self.directory = os.path.dirname(tokenizer_file)
        self.bos = self._id_of(special.get("bos_token"), tokenizer_file)
        self.pad = self._id_of(special.get("pad_token"), tokenizer_file)
        eos = special.get("eos_token") or next((token for token in COMMON_EODS
                                                if self._tokenizer.token_to_id(token) is not None), None)
        self.eod = self._id_of(eos, tokenizer_file)
        if self.eod is None:
            raise InputError(f"--tokenizer-model {tokenizer_file}: no end-of-document token (no eos_token in "
                             f"{CONFIG_FILE}, none of {', '.join(COMMON_EODS)} in the vocabulary); add eos_token "
                             f"to {CONFIG_FILE}")

    def _id_of(self, token: Optional[str], source: str) -> Optional[int]:
        if token is None:
            return None
        token_id = self._tokenizer.token_to_id(token)
        if token_id is None:
            raise InputError(f"--tokenizer-model {source}: {CONFIG_FILE} names the special token {token!r}, which "
                             "the vocabulary does not hold")
        return token_id

    def chat_template_tokenizer(self):
        """transformers' tokenizer of the same directory, for its apply_chat_template (read offline)."""
        from transformers import AutoTokenizer
        try:
            tokenizer = AutoTokenizer.from_pretrained(self.directory, local_files_only=True)
        except (OSError, ValueError, TypeError) as err:
            raise InputError(f"--tokenizer-model {self.directory}: transformers cannot read the tokenizer for its "
                             f"chat template ({err}); fix {CONFIG_FILE}") from None
        if not getattr(tokenizer, "chat_template", None):
            raise InputError(f"--tokenizer-model {self.directory}: {CONFIG_FILE} has no chat_template, which chat "
                             "rows (messages, conversations) are rendered with; use a chat model's tokenizer, or "
                             "alpaca / prompt-completion rows")
        return tokenizer

    def tokenize(self, text):
        return self.tokenize_batch([text])[0].tolist()

    def tokenize_batch(self, texts):
        """(ids of all texts concatenated, int64 length per text)."""
        import numpy as np
        texts = [replace_lone_surrogates(text) for text in texts]
        encodings = self._tokenizer.encode_batch(texts)
        return pack_token_arrays([np.asarray(encoding.ids, dtype=np.int32) for encoding in encodings])

    def detokenize(self, ids):
        return self._tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)
