"""The GPT-2 BPE tokenizer (megatron/tokenizer/gpt2_bpe.py): ids against hand-computed values and against an
independent reference encoder, the batch path against the single-text path (also under threads), and every error
of its files."""
import json
import pickle
import random
import re

import numpy as np
import pytest
from tests.helpers.tokenizer_texts import VARIED_TEXTS, assert_batch_matches_single
from tests.helpers.gpt2_reference_bpe import ReferenceGPT2Encoder, byte_to_char_table, docstring_corpus
from tokenizers import Tokenizer, models, pre_tokenizers

from megatron.errors import InputError
from megatron.tokenizer import build_tokenizer
from megatron.tokenizer.gpt2_bpe import GPT2BPETokenizer
from megatron.tokenizer.bpe_training import train_bpe_vocab

def write_vocab_files(directory, vocab, merge_lines):
    vocab_path, merges_path = directory / "vocab.json", directory / "merges.txt"
    vocab_path.write_text(json.dumps(vocab), encoding="utf-8")
    merges_path.write_text("#version: 0.2\n" + "".join(line + "\n" for line in merge_lines), encoding="utf-8")
    return str(vocab_path), str(merges_path)


# A tiny vocab whose ids can be worked out by hand. "Ġ" is the byte-level character of a space.
TINY_MERGES = ["l l", "e ll", "h ell", "Ġ w", "o r", "Ġw or", "a b", "b c"]


def tiny_vocab(id_order):
    """"merge": ids byte value (0..255), then 256.. per merge line, <|endoftext|> last.
    "swapped": the same but the last two merges swap ids, so only those are out of merge order.
    "reversed": <|endoftext|> is 0, byte b is b + 1 and the merges count down from 264.
    Outside "merge" order, merge priority cannot be read off the ids."""
    byte_chars = byte_to_char_table()
    merged = [line.replace(" ", "") for line in TINY_MERGES]
    if id_order == "reversed":
        vocab = {"<|endoftext|>": 0}
        vocab.update({byte_chars[b]: b + 1 for b in range(256)})
        vocab.update({token: 264 - i for i, token in enumerate(merged)})
        return vocab
    vocab = {byte_chars[b]: b for b in range(256)}
    vocab.update({token: 256 + i for i, token in enumerate(merged)})
    vocab["<|endoftext|>"] = 264
    if id_order == "swapped":
        vocab["ab"], vocab["bc"] = vocab["bc"], vocab["ab"]
    return vocab


# "hello world": hello -> h e ll o -> h ell o -> hell o; " world" -> Ġw o r l d -> Ġw or l d -> Ġwor l d.
# "abc": "a b" outranks "b c", so ab c (it would be a bc if ranks were read off the ids).
HAND_COMPUTED = {
    "merge": {"hello world": [258, ord("o"), 261, ord("l"), ord("d")], "abc": [262, ord("c")],
              "<|endoftext|>": list(b"<|endoftext|>"), "": []},
    "swapped": {"hello world": [258, ord("o"), 261, ord("l"), ord("d")], "abc": [263, ord("c")],
                "<|endoftext|>": list(b"<|endoftext|>"), "": []},
    "reversed": {"hello world": [262, ord("o") + 1, 259, ord("l") + 1, ord("d") + 1], "abc": [258, ord("c") + 1],
                 "<|endoftext|>": [b + 1 for b in b"<|endoftext|>"], "": []},
}
EOD_ID = {"merge": 264, "swapped": 264, "reversed": 0}


@pytest.fixture(scope="module")
def trained_files(tmp_path_factory):
    return train_bpe_vocab(docstring_corpus(), 1200, tmp_path_factory.mktemp("bpe"))


@pytest.fixture(scope="module")
def gpt2_tokenizer(trained_files):
    return GPT2BPETokenizer(*trained_files)


# ---------------------------------------------------------------- GPT-2 BPE: hand-computed ids

@pytest.mark.parametrize("id_order", ["merge", "swapped", "reversed"])
def test_tiny_vocab_hand_computed_ids(tmp_path, id_order):
    files = write_vocab_files(tmp_path, tiny_vocab(id_order), TINY_MERGES)
    tokenizer = build_tokenizer("GPT2BPETokenizer", vocab_file=files[0], merge_file=files[1])
    reference = ReferenceGPT2Encoder(*files)
    assert tokenizer.vocab_size == 265
    assert tokenizer.eod == EOD_ID[id_order]
    for text, expected in HAND_COMPUTED[id_order].items():
        assert tokenizer.tokenize(text) == expected, text
        assert reference.encode(text) == expected, text  # the oracle itself is right on this vocab
        assert tokenizer.detokenize(expected) == text
    assert_batch_matches_single(tokenizer, list(HAND_COMPUTED[id_order]) + VARIED_TEXTS)
    assert tokenizer.tokenize("hello abc world") == reference.encode("hello abc world")


def test_merges_without_version_line_and_with_crlf(tmp_path):
    vocab_path, merges_path = write_vocab_files(tmp_path, tiny_vocab("merge"), TINY_MERGES)
    with open(merges_path, "w", encoding="utf-8", newline="") as f:
        f.write("".join(line + "\r\n" for line in TINY_MERGES))
    tokenizer = build_tokenizer("GPT2BPETokenizer", vocab_file=vocab_path, merge_file=merges_path)
    assert tokenizer.tokenize("hello world") == HAND_COMPUTED["merge"]["hello world"]


# ---------------------------------------------------------------- GPT-2 BPE: against the reference encoder

def test_trained_vocab_matches_reference_and_hf_tokenizers(trained_files, gpt2_tokenizer):
    reference = ReferenceGPT2Encoder(*trained_files)
    hf = Tokenizer(models.BPE.from_file(*trained_files))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    texts = VARIED_TEXTS + docstring_corpus()[::3]
    ids, lengths = gpt2_tokenizer.tokenize_batch(texts)
    per_text = np.split(ids, np.cumsum(lengths)[:-1])
    for text, got in zip(texts, per_text):
        expected = reference.encode(text)
        assert got.tolist() == expected, text
        assert hf.encode(text).ids == expected, text
        assert gpt2_tokenizer.detokenize(got) == text
    assert sum(lengths) < sum(len(t.encode()) for t in texts) / 2  # merges really were applied


def test_random_strings_match_reference(trained_files, gpt2_tokenizer):
    """Seeded random mixes of the pieces the split pattern treats specially, and random code points from
    every plane, where the Rust and Python regex engines' Unicode tables could disagree."""
    reference = ReferenceGPT2Encoder(*trained_files)
    pieces = [" ", "  ", "\n", "\t", "\r", "\x0b", "\x0c", "\x1c", "\x85", "\xa0", "\u2028", "\u3000", "'",
              "s", "t", "re", "ll", "1", "23", "a", "the", "é", "😀", "中", "!", "..", "<|endoftext|>", "\x00",
              "\u0301", "٣", "Ⅻ", "_"]
    rng = random.Random(1234)
    texts = ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 30))) for _ in range(1500)]
    code_points = [cp for cp in rng.sample(range(0x110000), 4000) if not 0xD800 <= cp < 0xE000]
    texts += [f"a{c}b {c}1 {c}{c}  {c}\n" for c in map(chr, code_points)]
    ids, lengths = gpt2_tokenizer.tokenize_batch(texts)
    for text, got in zip(texts, np.split(ids, np.cumsum(lengths)[:-1])):
        assert got.tolist() == reference.encode(text), repr(text)


def test_survives_pickling_for_worker_processes(gpt2_tokenizer):
    copy = pickle.loads(pickle.dumps(gpt2_tokenizer))
    assert copy.tokenize(VARIED_TEXTS[7]) == gpt2_tokenizer.tokenize(VARIED_TEXTS[7])
    assert (copy.vocab_size, copy.eod) == (gpt2_tokenizer.vocab_size, gpt2_tokenizer.eod)


def test_literal_endoftext_is_text_not_eod(gpt2_tokenizer):
    ids = gpt2_tokenizer.tokenize("a <|endoftext|> b")
    assert gpt2_tokenizer.eod not in ids
    assert gpt2_tokenizer.detokenize(ids) == "a <|endoftext|> b"
    assert gpt2_tokenizer.detokenize([gpt2_tokenizer.eod]) == "<|endoftext|>"


def test_batch_matches_single_under_threads(gpt2_tokenizer):
    assert_batch_matches_single(gpt2_tokenizer, VARIED_TEXTS + docstring_corpus()[:60])
    ids, lengths = gpt2_tokenizer.tokenize_batch([])
    assert ids.size == 0 and lengths.size == 0


def test_lone_surrogates_become_replacement_characters(gpt2_tokenizer):
    assert gpt2_tokenizer.tokenize("a\ud800b") == gpt2_tokenizer.tokenize("a\ufffdb")
    ids, lengths = gpt2_tokenizer.tokenize_batch(["x \udfff", "ok"])
    assert ids.tolist() == gpt2_tokenizer.tokenize("x \ufffd") + gpt2_tokenizer.tokenize("ok")


def test_detokenize_replaces_partial_utf8(gpt2_tokenizer):
    ids = gpt2_tokenizer.tokenize("龍")  # three bytes, absent from the training corpus: three tokens
    assert len(ids) == 3
    assert gpt2_tokenizer.detokenize(ids[:-1]) == "\ufffd"


# ---------------------------------------------------------------- GPT-2 BPE: bad files

def expect_error(tmp_path, vocab, merge_lines, *fragments, vocab_text=None):
    vocab_path, merges_path = write_vocab_files(tmp_path, vocab, merge_lines)
    if vocab_text is not None:
        (tmp_path / "vocab.json").write_text(vocab_text, encoding="utf-8")
    with pytest.raises(InputError) as err:
        build_tokenizer("GPT2BPETokenizer", vocab_file=vocab_path, merge_file=merges_path)
    for fragment in fragments:
        assert fragment in str(err.value)


def test_vocab_not_json(tmp_path):
    expect_error(tmp_path, {}, [], "vocab.json:3", "not valid JSON", vocab_text='{"a": 0,\n "b": 1,\n "c": }')


def test_vocab_not_an_object(tmp_path):
    expect_error(tmp_path, {}, [], "--vocab-file", "list", vocab_text='["a", "b"]')


def test_vocab_ids_not_zero_to_n(tmp_path):
    vocab = tiny_vocab("merge")
    expect_error(tmp_path, {**vocab, "<|endoftext|>": 999}, TINY_MERGES, "'<|endoftext|>' has id 999")
    expect_error(tmp_path, {**vocab, "<|endoftext|>": 0}, TINY_MERGES, "share id 0")
    expect_error(tmp_path, {**vocab, "<|endoftext|>": "264"}, TINY_MERGES, "has id '264'")


def test_vocab_missing_byte_tokens(tmp_path):
    vocab = {token: i for i, token in enumerate(t for t in tiny_vocab("merge") if t != "Ġ")}
    expect_error(tmp_path, vocab, [], "0x20", "byte-level tokens")


def test_vocab_missing_endoftext(tmp_path):
    vocab = {token: i for i, token in enumerate(t for t in tiny_vocab("merge") if t != "<|endoftext|>")}
    expect_error(tmp_path, vocab, TINY_MERGES, "<|endoftext|>", "vocab.json")


def test_merges_malformed_line(tmp_path):
    expect_error(tmp_path, tiny_vocab("merge"), ["l l", "e ll x"], "merges.txt:3", "'e ll x'")
    expect_error(tmp_path, tiny_vocab("merge"), ["l l", "ell"], "merges.txt:3", "two tokens")


def test_merges_unknown_part_or_result(tmp_path):
    expect_error(tmp_path, tiny_vocab("merge"), ["l l", "q ll"], "merges.txt:3", "'qll'")
    expect_error(tmp_path, tiny_vocab("merge"), ["l l", "zz ll"], "merges.txt:3", "'zz'")
    expect_error(tmp_path, tiny_vocab("merge"), TINY_MERGES + ["ll o"], f"merges.txt:{len(TINY_MERGES) + 2}", "'llo'")


def test_merges_creating_the_same_token_twice(tmp_path):
    vocab = tiny_vocab("merge")
    vocab["lll"] = len(vocab)
    expect_error(tmp_path, vocab, ["l l", "ll l", "l ll"], "merges.txt:4", "line 3 already creates")


def test_missing_files_name_the_flag(tmp_path):
    vocab_path, merges_path = write_vocab_files(tmp_path, tiny_vocab("merge"), TINY_MERGES)
    missing = str(tmp_path / "nope.json")
    with pytest.raises(InputError, match=re.escape(f"--vocab-file {missing}")):
        build_tokenizer("GPT2BPETokenizer", vocab_file=missing, merge_file=merges_path)
    with pytest.raises(InputError, match=re.escape(f"--merge-file {missing}")):
        build_tokenizer("GPT2BPETokenizer", vocab_file=vocab_path, merge_file=missing)
    with pytest.raises(InputError, match="needs --merge-file"):
        build_tokenizer("GPT2BPETokenizer", vocab_file=vocab_path)
    with pytest.raises(InputError, match="--vocab-file"):
        build_tokenizer("GPT2BPETokenizer", vocab_file=str(tmp_path), merge_file=merges_path)  # a directory
