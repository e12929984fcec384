"""Tokenizer flags (megatron/config/flags/tokenizer.py): defaults for training and none for generation, the files
each tokenizer type needs, and the TokenizerConfig."""
import pytest

from megatron.config.flags import tokenizer
from megatron.config.job import TokenizerConfig
from tests.helpers.flag_groups import parsed_alone, refusal, resolved


def test_defaults_for_training_and_as_trained():
    assert parsed_alone(tokenizer)["tokenizer_type"] == "GPT2BPETokenizer"
    assert parsed_alone(tokenizer, as_trained=True) == {"tokenizer_type": None, "vocab_file": None,
                                                        "merge_file": None, "tokenizer_model": None,
                                                        "vocab_size": None}


@pytest.mark.parametrize("changed, message", [
    ({"tokenizer_type": "GPT2BPETokenizer", "vocab_file": None},
     "--tokenizer-type GPT2BPETokenizer needs --vocab-file; give the path of GPT-2's vocab.json"),
    ({"tokenizer_type": "GPT2BPETokenizer", "vocab_file": "absent.json"},
     "--vocab-file absent.json does not exist; give the path of GPT-2's vocab.json"),
    ({"tokenizer_type": "SentencePieceTokenizer", "tokenizer_model": "absent.model"},
     "--tokenizer-model absent.model does not exist; give the path of a SentencePiece .model file"),
    ({"tokenizer_type": "HFTokenizer"},
     "--tokenizer-type HFTokenizer needs --tokenizer-model; give a Hugging Face tokenizer directory or its "
     "tokenizer.json"),
    ({"tokenizer_type": "HFTokenizer", "tokenizer_model": "absent"},
     "--tokenizer-model absent does not exist; give a Hugging Face tokenizer directory or its tokenizer.json"),
    ({"vocab_size": None}, "--tokenizer-type NullTokenizer needs --vocab-size N"),
])
def test_refusals(changed, message):
    assert refusal(tokenizer.validate, {**resolved(), **changed}) == message


def test_gpt2_files_that_exist_pass(tmp_path):
    (tmp_path / "vocab.json").write_text("{}")
    (tmp_path / "merges.txt").write_text("")
    tokenizer.validate({**resolved(), "tokenizer_type": "GPT2BPETokenizer", "vocab_file": str(tmp_path / "vocab.json"),
                        "merge_file": str(tmp_path / "merges.txt")})


def test_section():
    assert tokenizer.section(resolved()) == TokenizerConfig(
        tokenizer_type="NullTokenizer", vocab_file=None, merge_file=None, tokenizer_model=None, vocab_size=100,
        make_vocab_size_divisible_by=128)
