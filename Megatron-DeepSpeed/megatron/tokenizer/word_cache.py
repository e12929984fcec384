"""Token ids remembered per word, in front of a GPT-2-pattern BPE engine, found with numpy over UTF-8 bytes.

Natural text repeats its words heavily, so after the first documents almost every word is looked up instead of
passing through the engine's regex and merges; only words not seen before reach the engine. The whole batch
is cut, keyed and looked up with array operations, so no Python object is made per word.

Why cutting text into words changes no id. GPT-2's split pattern
(`'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+`) has no look-behind, and none
of its pre-tokens holds a non-whitespace character followed by whitespace (a space may only lead one). So a
pre-token always starts (a) at whitespace that follows a non-whitespace character, and (b) at a space followed by
a non-whitespace character: after a non-whitespace character that is (a); after whitespace, that run started a
pre-token of its own and `\\s+(?!\\S)` ends it right before the space. At both kinds of cut the look-ahead that
ended the pre-token before sees whitespace in context and the end of the text in the piece alone, which it
treats alike. So the pieces, encoded one by one, give the ids of the whole text. Cuts are only made at ASCII
bytes whose neighbours are plainly (non-)whitespace; "whitespace" is Unicode's White_Space, which is what
`\\s` means to tiktoken's Rust regex (Python's `str.isspace` differs), so bytes that may start a non-ASCII
White_Space character are never taken as non-whitespace.
"""
import threading
from typing import Callable, Iterator

import numpy as np

from megatron.growing_array import GrowingArray

KEY_BYTES = 32  # words up to this long (99.7% of them in English prose and code) are found by hash, longer by dict
CHUNK_CHARS = 1 << 18  # text encoded at a time: its per-word arrays take about 50 bytes per byte
_CUT_SEARCH_CHARS = 4096  # characters searched at a time for a place to cut a long text
MAX_CACHED_WORDS = 1 << 18
MAX_CACHED_TOKENS = 1 << 22
_FINGERPRINT_MASK = 0x7FFFFFFF  # a slot holds (fingerprint << 32) | entry, or -1 when empty

_KEY_WORDS = KEY_BYTES // 8
# _KEY_MASKS[n]: the key words' bit masks that keep a word's first n bytes.
_KEY_MASKS = np.array([[(1 << 8 * min(max(n - 8 * i, 0), 8)) - 1 for i in range(_KEY_WORDS)]
                       for n in range(KEY_BYTES + 1)], dtype=np.uint64)
_MIX = np.array([0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93,
                 0xFF51AFD7ED558CCD], dtype=np.uint64)


def _byte_classes(data: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per UTF-8 byte: ASCII whitespace; ASCII non-whitespace; first byte of a character that is surely not
    White_Space (ASCII ones, and lead bytes whose characters hold no White_Space: 0xC2 holds U+0085 and U+00A0,
    0xE1 U+1680, 0xE2 U+2000-U+205F, 0xE3 U+3000, so those are left out)."""
    ascii_whitespace = (data == 0x20) | ((data >= 0x09) & (data <= 0x0D))
    ascii_non_whitespace = (data < 0x80) & ~ascii_whitespace
    starts_non_whitespace = (ascii_non_whitespace | ((data >= 0xC3) & (data <= 0xE0))
                             | ((data >= 0xE4) & (data <= 0xF4)))
    return ascii_whitespace, ascii_non_whitespace, starts_non_whitespace


def word_starts(data: np.ndarray, text_starts: np.ndarray, text_ends: np.ndarray) -> np.ndarray:
    """Sorted byte offsets where a piece starts: every non-empty text's start and the cuts (a) and (b) of the
    module docstring that lie inside one text."""
    size = data.size
    ascii_whitespace, ascii_non_whitespace, starts_non_whitespace = _byte_classes(data)
    inside = np.ones(max(size - 1, 0), dtype=bool)  # byte i and byte i + 1 belong to the same text
    last_bytes = text_ends[text_ends > text_starts] - 1
    inside[last_bytes[last_bytes < size - 1]] = False
    starts = np.zeros(size, dtype=bool)
    starts[:-1] |= (data[:-1] == 0x20) & starts_non_whitespace[1:] & inside  # (b): the space starts a piece
    starts[1:] |= ascii_non_whitespace[:-1] & ascii_whitespace[1:] & inside  # (a): the whitespace does
    starts[text_starts[text_ends > text_starts]] = True
    return np.flatnonzero(starts)


def utf8(text: str, chunk_chars: int = 1 << 16) -> bytes:
    """`text` in UTF-8 (a lone surrogate kept: surrogatepass; the engine replaces it), encoded `chunk_chars`
    characters at a time where it is not ASCII: CPython's encoder first reserves up to 4 bytes per character."""
    if text.isascii():
        return text.encode("ascii")
    return b"".join(text[start:start + chunk_chars].encode("utf-8", "surrogatepass")
                    for start in range(0, len(text), chunk_chars))


def piece_cuts(text: str, chunk_chars: int) -> list[int]:
    """Offsets about `chunk_chars` characters apart at which `text` may be cut: pre-token starts (module
    docstring), so its pieces encoded one by one give the ids of the whole. Each is looked for in a window of
    the text; a start found there is one in the text, as the cut rules look one byte to each side and the window
    keeps the character before."""
    cuts, position = [], chunk_chars
    while position < len(text):
        window = utf8(text[position - 1:position + _CUT_SEARCH_CHARS])
        starts = word_starts(np.frombuffer(window, dtype=np.uint8), np.zeros(1, dtype=np.int64),
                             np.array([len(window)]))
        inner = starts[starts >= 1]
        if inner.size:  # cuts fall on ASCII bytes: the bytes before one decode to whole characters
            cuts.append(position - 1 + len(window[:int(inner[0])].decode("utf-8", "surrogatepass")))
            position = cuts[-1] + chunk_chars
        else:
            position += _CUT_SEARCH_CHARS
    return cuts


def _pieces(text: str, chunk_chars: int) -> Iterator[bytes]:
    """`text` in UTF-8, a piece at a time: only one piece's copy is held at once."""
    bounds = [0, *piece_cuts(text, chunk_chars), len(text)]
    for start, end in zip(bounds[:-1], bounds[1:]):
        yield utf8(text[start:end])


def _join_releasing(parts: list[np.ndarray]) -> np.ndarray:
    """np.concatenate(parts), emptying `parts` as it goes: each part is released once copied, and the result's
    pages are touched only as parts arrive, so joining takes about the memory of the result alone."""
    if len(parts) == 1:
        return parts.pop()
    joined = np.empty(sum(part.size for part in parts), dtype=parts[0].dtype)
    position = 0
    parts.reverse()
    while parts:
        part = parts.pop()
        joined[position:position + part.size] = part
        position += part.size
    return joined


def word_keys(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """[words, KEY_BYTES / 8] uint64: each word's bytes (at most KEY_BYTES of them), zero-padded."""
    padded = np.concatenate([data, np.zeros(KEY_BYTES, dtype=np.uint8)])
    rows = np.lib.stride_tricks.sliding_window_view(padded, KEY_BYTES)[starts]
    return rows.view("<u8").reshape(len(starts), _KEY_WORDS) & _KEY_MASKS[lengths]


def key_hashes(keys: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """One uint64 per key and length, which picks the word's slot; a found slot's word is then compared with
    the whole key, so a collision costs a longer probe, never a wrong id."""
    with np.errstate(over="ignore"):
        mixed = keys @ _MIX[:_KEY_WORDS] + lengths.astype(np.uint64) * _MIX[-1]
        mixed ^= mixed >> np.uint64(29)
        mixed *= _MIX[0]
        mixed ^= mixed >> np.uint64(32)
    return mixed


class WordCache:
    """Encodes batches of texts through `encode` (text -> id array), one word at a time, remembering each
    word's ids. Memory is bounded: past MAX_CACHED_WORDS words or MAX_CACHED_TOKENS ids the
    cache starts afresh between batches. Thread-safe (one batch at a time); pickles without its contents."""

    def __init__(self, encode: Callable[[str], np.ndarray], token_byte_counts: np.ndarray,
                 max_words: int = MAX_CACHED_WORDS, max_tokens: int = MAX_CACHED_TOKENS,
                 chunk_chars: int = CHUNK_CHARS):
        """`token_byte_counts[id]`: how many bytes of text token `id` stands for."""
        self._encode, self._token_byte_counts = encode, token_byte_counts
        self._max_words, self._max_tokens, self._chunk_chars = max_words, max_tokens, chunk_chars
        # Hash slots: at least 4 per cached word, so at most a quarter fill up and probe chains stay short.
        self._slots_log2 = max(4, (4 * max_words).bit_length())
        self._slot_mask = (1 << self._slots_log2) - 1
        self._lock = threading.Lock()
        self._clear()

    def __getstate__(self):
        return {"encode": self._encode, "token_byte_counts": self._token_byte_counts,
                "max_words": self._max_words, "max_tokens": self._max_tokens, "chunk_chars": self._chunk_chars}

    def __setstate__(self, state):
        self.__init__(**state)

    def _clear(self):
        # Entry e is one encoded word: ids _ids[_id_starts[e]:][:_id_counts[e]], key _keys[e] of _lengths[e] bytes.
        # Each slot of the hash table holds a keyed word's entry and 31 bits of its hash (linear probing). Words
        # longer than KEY_BYTES (rare: URLs, long identifiers), and the rarer new words whose hashes collide within
        # a batch, are found through a dict of their bytes instead.
        self._ids = GrowingArray(np.int32)
        self._id_starts = GrowingArray(np.int64)
        self._id_counts = GrowingArray(np.int64)
        self._keys = GrowingArray(np.uint64, (_KEY_WORDS,))
        self._lengths = GrowingArray(np.int64)
        self._slots = np.full(1 << self._slots_log2, -1, dtype=np.int64)
        self._slots_used = 0
        self._entry_of_word_bytes = {}

    @property
    def cached_words(self) -> int:
        """Words remembered now (those too long for a key included)."""
        return self._id_starts.size

    def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(int32 ids of all texts concatenated, int64 id count per text). The texts are encoded about CHUNK_CHARS
        characters at a time, a longer one in pieces cut at pre-token starts (piece_cuts), so the per-word work for a
        document of any size needs the memory of one chunk, and its UTF-8 copy is made a piece at a time."""
        ids, per_text = [], np.zeros(len(texts), dtype=np.int64)
        for group_ids, per_piece, owners in self._encoded_groups(texts):
            ids.append(group_ids)
            np.add.at(per_text, owners, per_piece)
        return _join_releasing(ids), per_text

    def _encoded_groups(self, texts: list[str]) -> Iterator[tuple[np.ndarray, np.ndarray, list[int]]]:
        """(ids, id count per piece, text of each piece) of groups of the texts' UTF-8 pieces, about CHUNK_CHARS
        bytes each; at least one group."""
        group, owners, grouped_bytes = [], [], 0
        for owner, text in enumerate(texts):
            for piece in _pieces(text, self._chunk_chars):
                group.append(piece)
                owners.append(owner)
                grouped_bytes += len(piece)
                if grouped_bytes >= self._chunk_chars:
                    yield *self._encode_pieces(group), owners
                    group, owners, grouped_bytes = [], [], 0
        if group or not texts:
            yield *self._encode_pieces(group), owners

    def _encode_pieces(self, encoded: list) -> tuple[np.ndarray, np.ndarray]:
        """(int32 ids of the UTF-8 pieces concatenated, int64 id count per piece)."""
        text_lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
        text_ends = np.cumsum(text_lengths)
        text_starts = text_ends - text_lengths
        joined = b"".join(encoded)
        data = np.frombuffer(joined, dtype=np.uint8)
        starts = word_starts(data, text_starts, text_ends)
        lengths = np.diff(starts, append=data.size)
        keyed = np.flatnonzero(lengths <= KEY_BYTES)
        keys = word_keys(data, starts[keyed], lengths[keyed])
        hashes = key_hashes(keys, lengths[keyed])
        with self._lock:
            if self._id_starts.size > self._max_words or self._ids.size > self._max_tokens:
                self._clear()
            entries = np.full(len(starts), -1, dtype=np.int64)
            entries[keyed] = self._look_up(keys, lengths[keyed], hashes)
            new = np.flatnonzero(entries[keyed] < 0)
            if new.size:
                entries[keyed[new]] = self._cache(joined, data, starts[keyed[new]], lengths[keyed[new]], keys[new],
                                                  hashes[new])
            long_words = np.flatnonzero(lengths > KEY_BYTES)
            if long_words.size:
                entries[long_words] = self._entries_by_dict(joined, data, starts[long_words], lengths[long_words])
            counts = self._id_counts.values[entries]
            ends = np.cumsum(counts)
            first_id = np.repeat(self._id_starts.values[entries] - (ends - counts), counts)
            ids = self._ids.values[first_id + np.arange(first_id.size)]
        ids_before = np.concatenate([[0], ends])
        per_text = ids_before[np.searchsorted(starts, text_ends)] - ids_before[np.searchsorted(starts, text_starts)]
        return ids, per_text

    def _look_up(self, keys, lengths, hashes) -> np.ndarray:
        """The entry of each keyed word, -1 where it is not cached."""
        found = np.full(len(hashes), -1, dtype=np.int64)
        if not self._slots_used:
            return found
        words = np.arange(len(hashes))
        slots = (hashes >> np.uint64(64 - self._slots_log2)).astype(np.int64)
        fingerprints = (hashes & np.uint64(_FINGERPRINT_MASK)).astype(np.int64)
        cached_keys, cached_lengths = self._keys.values.reshape(-1), self._lengths.values
        while words.size:
            held = self._slots[slots]
            candidate = (held >> 32) == fingerprints
            entries = np.where(candidate, held & 0xFFFFFFFF, 0)
            same = candidate & (cached_lengths[entries] == lengths)
            for column in range(_KEY_WORDS):
                same &= cached_keys[entries * _KEY_WORDS + column] == keys[:, column]
            found[words[same]] = entries[same]
            probe_on = (held >= 0) & ~same  # the slot holds another word: try the next one
            words, keys, lengths = words[probe_on], keys[probe_on], lengths[probe_on]
            fingerprints = fingerprints[probe_on]
            slots = (slots[probe_on] + 1) & self._slot_mask
        return found

    def _cache(self, joined, data, starts, lengths, keys, hashes) -> np.ndarray:
        """Entries for keyed words not cached yet: each distinct one is encoded, recorded with its key and put in
        a slot. (Distinct words whose hashes collide within the batch go through the dict instead.)"""
        _, first, same_hash_as = np.unique(hashes, return_index=True, return_inverse=True)
        same_hash_as = same_hash_as.reshape(-1)
        representative = first[same_hash_as]
        collides = (lengths != lengths[representative]) | (keys != keys[representative]).any(axis=1)
        new_entries = self._new_entries(joined, data, starts[first], lengths[first])
        self._keys.values[new_entries] = keys[first]
        self._lengths.values[new_entries] = lengths[first]
        self._put_in_slots(hashes[first], new_entries)
        entries = new_entries[same_hash_as]
        if collides.any():
            entries[collides] = self._entries_by_dict(joined, data, starts[collides], lengths[collides])
        return entries

    def _put_in_slots(self, hashes, entries) -> None:
        """Linear-probing insertion, all words at once: each round, words whose slot is free claim it (one per
        slot), the others move on to the next slot. Once a quarter of the slots are taken, the remaining words
        stay uncached until the cache starts afresh."""
        room = max(0, (self._slot_mask + 1) // 4 - self._slots_used)
        hashes, entries = hashes[:room], entries[:room]
        slots = (hashes >> np.uint64(64 - self._slots_log2)).astype(np.int64)
        values = ((hashes & np.uint64(_FINGERPRINT_MASK)).astype(np.int64) << 32) | entries
        waiting = np.arange(len(hashes))
        while waiting.size:
            free = self._slots[slots[waiting]] < 0
            claimed_slots, first_claim = np.unique(slots[waiting[free]], return_index=True)
            winners = waiting[free][first_claim]
            self._slots[claimed_slots] = values[winners]
            waiting = np.setdiff1d(waiting, winners, assume_unique=True)
            slots[waiting] = np.where(self._slots[slots[waiting]] >= 0, (slots[waiting] + 1) & self._slot_mask,
                                      slots[waiting])
        self._slots_used += len(hashes)

    def _entries_by_dict(self, joined: bytes, data, starts, lengths) -> np.ndarray:
        """Entries of words found (or added) through the dict of their bytes: words too long to key, and new words
        whose hashes collide within a batch."""
        entries = np.empty(len(starts), dtype=np.int64)
        new = []
        for index, (start, length) in enumerate(zip(starts.tolist(), lengths.tolist())):
            entry = self._entry_of_word_bytes.get(joined[start:start + length])
            if entry is None:
                new.append(index)
            entries[index] = -1 if entry is None else entry
        if new:
            new = np.array(new)
            words = [joined[start:start + length] for start, length in zip(starts[new].tolist(), lengths[new].tolist())]
            first_of_word = {}
            for index, word in zip(new.tolist(), words):
                first_of_word.setdefault(word, index)
            distinct = np.array(list(first_of_word.values()))
            new_entries = self._new_entries(joined, data, starts[distinct], lengths[distinct])
            self._entry_of_word_bytes.update(zip(first_of_word, new_entries.tolist()))
            entries[new] = [self._entry_of_word_bytes[word] for word in words]
        return entries

    def _new_entries(self, joined: bytes, data, starts, lengths) -> np.ndarray:
        """Encode distinct words and append them as entries (no key yet); returns each one's entry. The engine has
        a cost per call, so the words that begin with a cut (b) (a space before a non-whitespace character: most
        words) are encoded together in one call, which gives the same ids, and cut apart where the bytes of the
        ids reach each word's end. The others are encoded one by one."""
        entries = np.empty(len(starts), dtype=np.int64)
        second = data[np.minimum(starts + 1, max(data.size - 1, 0))]
        surrogates = np.concatenate([[0], np.cumsum(data == 0xED)])  # replaced by the engine: byte counts change
        together = ((data[starts] == 0x20) & (lengths > 1) & _byte_classes(second)[2]
                    & (surrogates[starts + lengths] == surrogates[starts]))
        if together.any():
            word_ids, counts = self._encode_together(data, starts[together], lengths[together])
            if word_ids is not None:
                entries[together] = self._append(word_ids, counts)
            else:
                together[:] = False
        alone = np.flatnonzero(~together)
        if alone.size:
            encoded = [self._encode(joined[start:start + length].decode("utf-8", "surrogatepass"))
                       for start, length in zip(starts[alone].tolist(), lengths[alone].tolist())]
            counts = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
            entries[alone] = self._append(np.concatenate(encoded), counts)
        return entries

    def _encode_together(self, data, starts, lengths):
        """(ids of the words run together, id count of each word), or (None, None) if the ids do not end exactly
        at the words' ends (which the cut rules rule out; checked all the same)."""
        ends = np.cumsum(lengths)
        positions = np.repeat(starts - (ends - lengths), lengths) + np.arange(ends[-1])
        ids = self._encode(data[positions].tobytes().decode("utf-8"))
        id_ends = np.searchsorted(np.cumsum(self._token_byte_counts[ids]), ends) + 1
        if id_ends[-1] != len(ids) or not np.array_equal(np.cumsum(self._token_byte_counts[ids])[id_ends - 1], ends):
            return None, None
        return ids, np.diff(id_ends, prepend=0)

    def _append(self, ids: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """New entries for words whose ids are `ids`, back to back, `counts` of them each."""
        first_entry = self._id_starts.size
        self._id_starts.extend(self._ids.size + np.cumsum(counts) - counts)
        self._id_counts.extend(counts)
        self._ids.extend(ids.astype(np.int32, casting="same_kind", copy=False))
        self._keys.extend(np.zeros((len(counts), _KEY_WORDS), dtype=np.uint64))
        self._lengths.extend(np.full(len(counts), -1, dtype=np.int64))
        return np.arange(first_entry, first_entry + len(counts))
