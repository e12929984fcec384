"""Hugging Face tokenizers from a local tokenizer.json (megatron/tokenizer/hf_tokenizer.py): the ids the
`tokenizers` library gives, the end of document from tokenizer_config.json's eos_token or a common end token, the
files that travel with it, and each unusable file as one InputError naming it. With a converted Llama:
tests/families/llama/test_hf_adapter.py."""
import json

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from megatron.errors import InputError
from megatron.tokenizer.hf_tokenizer import HFTokenizer, hf_tokenizer_files
from tests.helpers.tokenizer_texts import assert_batch_matches_single

WORDS = ["<unk>", "<s>", "the", "lazy", "dog", "runs"]


def tokenizer_dir(tmp_path, words=WORDS, config=None):
    """A word-level tokenizer.json over `words` (and tokenizer_config.json holding `config`, if given)."""
    tokenizer = Tokenizer(models.WordLevel({word: index for index, word in enumerate(words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    if config is not None:
        (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return tmp_path


def test_ids_are_the_librarys_and_the_end_is_the_configs_eos(tmp_path):
    directory = tokenizer_dir(tmp_path, WORDS + ["</s>"], {"bos_token": "<s>", "eos_token": {"content": "runs"}})
    tokenizer = HFTokenizer(str(directory))
    assert (tokenizer.vocab_size, tokenizer.bos, tokenizer.eod) == (7, 1, 5)  # the config's eos over "</s>"
    assert tokenizer.tokenize("the lazy cat") == [2, 3, 0]
    assert tokenizer.detokenize([2, 4]) == "the dog"
    assert_batch_matches_single(tokenizer, ["the dog", "", "lazy lazy runs", "a\ud800b"])
    assert [path.rsplit("/", 1)[1] for path in hf_tokenizer_files(str(directory))] == ["tokenizer.json",
                                                                                       "tokenizer_config.json"]


def test_without_a_config_a_common_end_token_is_the_end(tmp_path):
    tokenizer = HFTokenizer(str(tokenizer_dir(tmp_path, WORDS + ["<|endoftext|>"]) / "tokenizer.json"))
    assert (tokenizer.bos, tokenizer.eod) == (None, 6)


@pytest.mark.parametrize("words, config, message", [
    (WORDS, None, "no end-of-document token (no eos_token in tokenizer_config.json, none of </s>, <|endoftext|>, "
                  "<|end_of_text|> in the vocabulary); add eos_token to tokenizer_config.json"),
    (WORDS, {"eos_token": "</eos>"}, "tokenizer_config.json names the special token '</eos>', which the vocabulary "
                                     "does not hold"),
])
def test_refusals(tmp_path, words, config, message):
    with pytest.raises(InputError) as error:
        HFTokenizer(str(tokenizer_dir(tmp_path, words, config)))
    assert str(error.value).endswith(message) and "\n" not in str(error.value)


def test_unusable_files(tmp_path):
    with pytest.raises(InputError, match=f"^--tokenizer-model {tmp_path}: no tokenizer.json there"):
        HFTokenizer(str(tmp_path))
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(InputError, match="tokenizer.json: not a Hugging Face tokenizer.json"):
        HFTokenizer(str(tmp_path))
    tokenizer_dir(tmp_path, WORDS + ["</s>"])
    (tmp_path / "tokenizer_config.json").write_text("{broken")
    with pytest.raises(InputError, match="tokenizer_config.json cannot be read as JSON .*; fix or remove it"):
        HFTokenizer(str(tmp_path))
