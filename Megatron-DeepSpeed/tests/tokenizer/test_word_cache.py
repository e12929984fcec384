"""The per-word cache in front of the BPE engine: cutting text into words and caching them must give exactly
the ids of encoding each whole text, whatever the whitespace, word lengths, batching and cache size; and a
word must reach the engine once."""
import pickle
import random

import numpy as np
import pytest
from tests.helpers.gpt2_reference_bpe import ReferenceGPT2Encoder, byte_to_char_table, docstring_corpus

from megatron.tokenizer.bpe_training import train_bpe_vocab
from megatron.tokenizer.word_cache import KEY_BYTES, WordCache, piece_cuts, word_starts

# Every Unicode White_Space character, characters Python's str.isspace() wrongly takes for it (\x1c-\x1f) or
# that look like it (U+180E, U+200B, U+FEFF), GPT-2's contraction pieces, and words longer than a cache key.
WHITESPACE = ["\t", "\n", "\x0b", "\x0c", "\r", " ", "\x85", "\xa0", "\u1680", *map(chr, range(0x2000, 0x200B)),
              "\u2028", "\u2029", "\u202f", "\u205f", "\u3000"]
LOOKALIKES = ["\x1c", "\x1d", "\x1e", "\x1f", "\u180e", "\u200b", "\ufeff"]
PIECES = [*WHITESPACE, *LOOKALIKES, " ", " ", "  ", "'", "'s", "'ll", "s", "re", "the", " the", "a", "1", "23", "é",
          "中文", "😀", "!", "..", "-", "_", "x" * (KEY_BYTES - 1), "y" * KEY_BYTES, "z" * (KEY_BYTES + 1),
          " " + "w" * (KEY_BYTES + 7), "<|endoftext|>"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return ReferenceGPT2Encoder(*train_bpe_vocab(docstring_corpus(), 600, tmp_path_factory.mktemp("bpe")))


class CountingEngine:
    """The reference encoder as the cache's engine, counting the texts it is asked to encode."""

    def __init__(self, reference):
        self.reference, self.texts = reference, []
        char_to_byte = {char: byte for byte, char in byte_to_char_table().items()}
        self.byte_counts = np.zeros(len(reference.vocab), dtype=np.int64)
        for token, token_id in reference.vocab.items():
            self.byte_counts[token_id] = sum(1 for char in token if char in char_to_byte)

    def __call__(self, text):
        self.texts.append(text)
        return np.array(self.reference.encode(text), dtype=np.int64)


def random_texts(seed, count, longest=40):
    rng = random.Random(seed)
    return ["".join(rng.choice(PIECES) for _ in range(rng.randint(0, longest))) for _ in range(count)]


def assert_encodes_like_whole_texts(cache, reference, texts, batch_size):
    for first in range(0, len(texts), batch_size):
        batch = texts[first:first + batch_size]
        ids, lengths = cache.encode_batch(batch)
        assert ids.dtype == np.int32 and lengths.dtype == np.int64 and len(lengths) == len(batch)
        for text, got in zip(batch, np.split(ids, np.cumsum(lengths)[:-1]) if batch else []):
            assert got.tolist() == reference.encode(text), repr(text)


@pytest.mark.parametrize("batch_size", [1, 13, 400])
def test_words_encode_like_whole_texts(reference, batch_size):
    engine = CountingEngine(reference)
    texts = random_texts(batch_size, 400) + docstring_corpus()[:40] + ["", " ", "a", "\n\n"]
    assert_encodes_like_whole_texts(WordCache(engine, engine.byte_counts), reference, texts, batch_size)


def test_a_full_cache_starts_afresh_and_stays_exact(reference):
    engine = CountingEngine(reference)
    cache = WordCache(engine, engine.byte_counts, max_words=3, max_tokens=40)
    texts = random_texts(7, 300, longest=12)
    assert_encodes_like_whole_texts(cache, reference, texts, 5)
    cache.encode_batch(["a"])  # a batch starts afresh once more than 3 words are cached
    assert cache.cached_words <= 4


def test_each_word_reaches_the_engine_once(reference):
    engine = CountingEngine(reference)
    cache = WordCache(engine, engine.byte_counts)
    texts = docstring_corpus()[:30] + [" " + "long" * KEY_BYTES + " tail"] * 3
    cache.encode_batch(texts)
    first_calls = len(engine.texts)
    # Words led by a space before a non-space go to the engine together, in one call per batch.
    assert 0 < first_calls < cache.cached_words
    cache.encode_batch(texts)
    cache.encode_batch(texts[::-1])
    assert len(engine.texts) == first_calls


def test_pickles_without_its_contents(reference):
    engine = CountingEngine(reference)
    cache = WordCache(engine, engine.byte_counts, max_words=50)
    cache.encode_batch(docstring_corpus()[:5])
    copy = pickle.loads(pickle.dumps(cache))
    assert copy.cached_words == 0
    texts = random_texts(3, 50)
    assert_encodes_like_whole_texts(copy, reference, texts, 50)


def test_word_starts_cut_before_spaces_and_after_words():
    text = b"ab  c\n\nd e.\xc2\xa0f \xe3\x80\x80g"
    data = np.frombuffer(text, dtype=np.uint8)
    # Cuts: whitespace after a word ("  c" at 2, "\n\nd" at 5, " e" at 8, " \u3000g" at 14), and a space
    # before a non-space (" c" at 3). None inside "ab", after the newlines, at "." or inside ".\xa0f" (NBSP may
    # be whitespace, so it is never taken for a word's start or end).
    assert word_starts(data, np.array([0]), np.array([len(text)])).tolist() == [0, 2, 3, 5, 8, 14]
    # Texts are cut apart at their boundaries, and an empty text has no piece.
    two = np.frombuffer(b"a bc d", dtype=np.uint8)
    assert word_starts(two, np.array([0, 3, 3]), np.array([3, 3, 6])).tolist() == [0, 1, 3, 4]


@pytest.mark.parametrize("chunk_chars", [7, 64])
def test_long_texts_cut_into_chunks_encode_like_whole_texts(reference, chunk_chars):
    """Texts far longer than a chunk are encoded in pieces (what bounds preprocessing's memory per document):
    the ids are those of each whole text, whatever whitespace the cuts fall on."""
    texts = ["".join(random_texts(seed, 60)) for seed in range(8)] + ["x" * 300, ""]
    cache = WordCache(CountingEngine(reference), CountingEngine(reference).byte_counts, chunk_chars=chunk_chars)
    assert_encodes_like_whole_texts(cache, reference, texts, batch_size=3)
    cuts = piece_cuts(texts[0], chunk_chars)
    assert len(cuts) > 10 and cuts == sorted(set(cuts)) and 0 < cuts[0] and cuts[-1] < len(texts[0])
