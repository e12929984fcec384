"""SentencePiece models (megatron/tokenizer/sentencepiece_tokenizer.py): ids and text as SentencePiece's own
processor gives them, for both upstream type names; the end-of-document id is the model's end-of-sentence piece;
a missing, unreadable or eos-less model is an InputError naming --tokenizer-model."""
import io
import pickle

import pytest
import sentencepiece

from megatron.errors import InputError
from megatron.tokenizer import build_tokenizer
from megatron.tokenizer.sentencepiece_tokenizer import SentencePieceTokenizer
from tests.helpers.gpt2_reference_bpe import docstring_corpus
from tests.helpers.tokenizer_texts import VARIED_TEXTS, assert_batch_matches_single


def train_sentencepiece(path, **options):
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(docstring_corpus()[-200:]), model_writer=model, vocab_size=600, model_type="bpe",
        byte_fallback=True, normalization_rule_name="identity", remove_extra_whitespaces=False,
        minloglevel=2, **options)
    path.write_bytes(model.getvalue())
    return str(path)


def test_sentencepiece_round_trip(tmp_path):
    model_path = train_sentencepiece(tmp_path / "sp.model")
    for tokenizer_type in ("SentencePieceTokenizer", "GPTSentencePieceTokenizer"):
        tokenizer = build_tokenizer(tokenizer_type, tokenizer_model=model_path)
        processor = sentencepiece.SentencePieceProcessor(model_file=model_path)
        assert isinstance(tokenizer, SentencePieceTokenizer)
        assert tokenizer.vocab_size == processor.get_piece_size() == 600
        assert tokenizer.eod == processor.eos_id() == 2
        for text in ["Return the list of files.", "Größe 😀 日本", "two  spaces", ""]:
            ids = tokenizer.tokenize(text)
            assert ids == processor.encode(text)
            assert tokenizer.detokenize(ids) == text
        assert_batch_matches_single(tokenizer, VARIED_TEXTS + docstring_corpus()[:30])
        assert tokenizer.tokenize("a\ud800b") == tokenizer.tokenize("a\ufffdb")
        assert pickle.loads(pickle.dumps(tokenizer)).tokenize(VARIED_TEXTS[1]) == tokenizer.tokenize(VARIED_TEXTS[1])


def test_sentencepiece_errors(tmp_path):
    with pytest.raises(InputError, match="needs --tokenizer-model"):
        build_tokenizer("SentencePieceTokenizer")
    with pytest.raises(InputError, match="--tokenizer-model .*nope.model"):
        build_tokenizer("SentencePieceTokenizer", tokenizer_model=str(tmp_path / "nope.model"))
    (tmp_path / "garbage.model").write_bytes(b"not a model")
    with pytest.raises(InputError, match="not a usable SentencePiece model"):
        build_tokenizer("SentencePieceTokenizer", tokenizer_model=str(tmp_path / "garbage.model"))
    no_eos = train_sentencepiece(tmp_path / "no_eos.model", eos_id=-1)
    with pytest.raises(InputError, match="no end-of-sentence piece"):
        build_tokenizer("SentencePieceTokenizer", tokenizer_model=no_eos)
