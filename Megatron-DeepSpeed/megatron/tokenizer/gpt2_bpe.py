"""GPT-2 byte-level BPE from vocab.json + merges.txt, with ids identical to OpenAI's reference encoder.

The engine is tiktoken's Rust BPE, built in memory from the two files: it splits text with GPT-2's
pattern and merges byte pairs in Rust, several times faster than the Python or HF `tokenizers` encoders.
In front of it a per-word cache (word_cache.py) answers the words it has already encoded, which in natural
text is almost all of them. tiktoken ranks a merge by the bytes of the token it creates, so each merge's
rank is its position in merges.txt; where vocab.json numbers tokens in that same order (GPT-2's own
files, files from train_bpe_vocab) the ranks are the vocab ids, otherwise ranks are mapped to ids
after encoding.
"""
import numpy as np
import tiktoken

from megatron.errors import InputError
from megatron.files.user_json import read_json_object
from megatron.tokenizer import read_user_file, replace_lone_surrogates
from megatron.tokenizer.word_cache import WordCache

GPT2_SPLIT_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
EOD_TOKEN = "<|endoftext|>"


def bytes_to_unicode():
    """GPT-2's byte -> character table: bytes that print as themselves keep their Latin-1 character,
    the other 68 take the characters from U+0100 on, so every token is a printable, space-free string."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {byte: chr(byte) for byte in printable}
    others = (byte for byte in range(256) if byte not in table)
    table.update({byte: chr(256 + offset) for offset, byte in enumerate(others)})
    return table


class GPT2BPETokenizer:
    """GPT-2 BPE tokenizer. A literal "<|endoftext|>" in the text is ordinary text, never `eod`:
    documents are separated by the preprocessing step appending `eod`, not by what they contain."""

    def __init__(self, vocab_file, merge_file):
        vocab = load_vocab(vocab_file)
        if EOD_TOKEN not in vocab:
            raise InputError(f"--vocab-file {vocab_file}: has no {EOD_TOKEN!r} token, which GPT-2 uses as the "
                             f"end-of-document id; add it to the vocab (train_bpe_vocab does)")
        merged_tokens = load_merges(merge_file, vocab, vocab_file)
        self.vocab_size = len(vocab)
        self.eod = vocab[EOD_TOKEN]
        self._id_to_bytes = _bytes_of_every_id(vocab)
        ranks, self._rank_to_id = _merge_ranks(vocab, merged_tokens)
        # EOD is registered as a special token but never allowed, so its literal stays text. It is there for
        # speed: tiktoken's numpy path first scans for special tokens, and with none registered that scan
        # stops at every character, which halves throughput.
        self._encoding = tiktoken.Encoding("gpt2-bpe", pat_str=GPT2_SPLIT_PATTERN, mergeable_ranks=ranks,
                                           special_tokens={EOD_TOKEN: max(ranks.values()) + 1})
        self._words = WordCache(self._encode, np.array([len(b) for b in self._id_to_bytes], dtype=np.int64))

    def tokenize(self, text):
        return self.tokenize_batch([text])[0].tolist()

    def tokenize_batch(self, texts):
        """(int32 ids of all texts concatenated, int64 length per text). Thread-safe, one batch at a time:
        for parallelism use processes (the cache's look-ups hold the GIL)."""
        return self._words.encode_batch(texts)

    def detokenize(self, ids):
        return b"".join([self._id_to_bytes[i] for i in ids]).decode("utf-8", errors="replace")

    def _encode(self, text):
        """Vocab ids of `text` straight from tiktoken (no cache)."""
        try:
            ranks = self._encoding.encode_to_numpy(text, disallowed_special=())
        except UnicodeEncodeError:
            ranks = self._encoding.encode_to_numpy(replace_lone_surrogates(text), disallowed_special=())
        return ranks if self._rank_to_id is None else self._rank_to_id[ranks]


def load_vocab(vocab_file):
    """token -> id from a GPT-2 vocab.json, checked to number its tokens 0..N-1 and to hold all 256
    byte-level tokens (without them some text could not be encoded at all)."""
    vocab = read_json_object(vocab_file, f"--vocab-file {vocab_file}",
                             "--vocab-file must be a GPT-2 vocab.json (a JSON object token -> id)")
    owner_of_id = {}
    for token, token_id in vocab.items():
        if type(token_id) is not int or not 0 <= token_id < len(vocab):
            raise InputError(f"--vocab-file {vocab_file}: token {token!r} has id {token_id!r}; the {len(vocab)} "
                             f"ids must be the integers 0..{len(vocab) - 1}")
        if token_id in owner_of_id:
            raise InputError(f"--vocab-file {vocab_file}: tokens {owner_of_id[token_id]!r} and {token!r} share "
                             f"id {token_id}; every token needs its own id")
        owner_of_id[token_id] = token
    missing = [f"0x{byte:02x}" for byte, char in bytes_to_unicode().items() if char not in vocab]
    if missing:
        raise InputError(f"--vocab-file {vocab_file}: lacks the byte-level tokens of {len(missing)} bytes "
                         f"({', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}); a GPT-2 byte-level "
                         f"vocab needs one token per byte value")
    return vocab


def load_merges(merge_file, vocab, vocab_file):
    """The token each merge of merges.txt creates, in file order, checked against the vocab: every merge
    must join two known tokens into a known, new token (tiktoken identifies a merge by its result)."""
    raw = read_user_file(merge_file, "--merge-file")
    try:
        lines = raw.decode("utf-8").split("\n")
    except UnicodeDecodeError as err:
        raise InputError(f"--merge-file {merge_file}: not UTF-8 text ({err.reason} at byte {err.start}); "
                         f"pass a GPT-2 merges.txt") from None
    byte_chars = set(bytes_to_unicode().values())
    line_of_token = {}
    for line_number, line in enumerate(lines, start=1):
        parts = line.split()
        if not parts or (line_number == 1 and line.startswith("#version")):
            continue
        where = f"{merge_file}:{line_number}"
        if len(parts) != 2:
            raise InputError(f"{where}: expected a merge (two tokens separated by one space), got {line!r}")
        merged = parts[0] + parts[1]
        for token in (*parts, merged):
            if token not in vocab:
                raise InputError(f"{where}: merge {line.strip()!r} needs token {token!r}, which --vocab-file "
                                 f"{vocab_file} lacks; vocab.json and merges.txt must come from the same training")
        if not byte_chars.issuperset(merged):
            raise InputError(f"{where}: merge {line.strip()!r} has characters outside GPT-2's byte-level "
                             f"alphabet; merges.txt must come from a byte-level BPE")
        if merged in line_of_token:
            raise InputError(f"{where}: merge {line.strip()!r} creates {merged!r}, which line "
                             f"{line_of_token[merged]} already creates; each merge must create a new token")
        line_of_token[merged] = line_number
    return list(line_of_token)


def _merge_ranks(vocab, merged_tokens):
    """(token bytes -> tiktoken rank, rank -> vocab id array or None when ranks already are vocab ids)."""
    byte_chars = [char for _, char in sorted(bytes_to_unicode().items())]
    tokens = byte_chars + merged_tokens
    merged_ids = [vocab[token] for token in merged_tokens]
    if all(earlier < later for earlier, later in zip(merged_ids, merged_ids[1:])):
        return {_to_bytes(token): vocab[token] for token in tokens}, None
    ranks = {_to_bytes(token): rank for rank, token in enumerate(tokens)}
    return ranks, np.array([vocab[token] for token in tokens], dtype=np.int32)


def _bytes_of_every_id(vocab):
    """id -> the bytes it stands for. A token with characters outside the byte-level alphabet (one added
    to the vocab by hand) stands for its UTF-8 text, as the reference decoder cannot map it at all."""
    id_to_bytes = [b""] * len(vocab)
    for token, token_id in vocab.items():
        if _BYTE_LEVEL_CHARS.issuperset(token):
            id_to_bytes[token_id] = _to_bytes(token)
        else:
            id_to_bytes[token_id] = token.encode("utf-8", errors="replace")
    return id_to_bytes


_BYTE_LEVEL_CHARS = frozenset(bytes_to_unicode().values())
_CHAR_TO_LATIN1 = {ord(char): byte for byte, char in bytes_to_unicode().items()}  # str.translate table


def _to_bytes(token):
    """The bytes a token of byte-level characters stands for (each character becomes the Latin-1 character of
    its byte, so the C codec does the conversion)."""
    return token.translate(_CHAR_TO_LATIN1).encode("latin-1")
