"""Megatron's NullTokenizer: the text already is token ids separated by whitespace; used for tests and
for data that was tokenized elsewhere."""
import numpy as np

from megatron.errors import InputError
from megatron.tokenizer import pack_token_arrays, require_positive_int


class NullTokenizer:
    """Ids come straight from the text; `eod` is the extra id --vocab-size, hence the reported
    `vocab_size` is one larger than the flag (Megatron's meaning)."""

    def __init__(self, vocab_size):
        self.eod = require_positive_int("--vocab-size", vocab_size)
        self.vocab_size = self.eod + 1

    def tokenize(self, text):
        return self.tokenize_batch([text])[0].tolist()

    def tokenize_batch(self, texts):
        return pack_token_arrays([self._parse(text) for text in texts])

    def detokenize(self, ids):
        return " ".join(str(int(i)) for i in ids)

    def _parse(self, text):
        try:
            ids = np.array([int(word) for word in text.split()], dtype=np.int64)
            valid = bool(((ids >= 0) & (ids <= self.eod)).all())
        except (ValueError, OverflowError):
            valid = False
        if not valid:
            raise InputError(f"NullTokenizer text {text[:80]!r}: must be whitespace-separated integer ids in "
                             f"0..{self.eod} (--vocab-size {self.eod}, plus the end-of-document id)")
        return ids.astype(np.int32)
