"""Hugging Face Mistral in and out: a seeded random transformers MistralForCausalLM (GQA 4:2, rope_theta 1e6, a
4-key sliding window inside the 12-token test sequence, sharded safetensors) imports at TP 2 and at TP 2 x PP 2,
computes transformers' logits, continues a short prompt and one longer than the window greedily as transformers'
generate does (our KV cache), and exports back bit for bit with the same config (sliding_window included); a
windowless one (v0.3) imports and comes back as the MistralForCausalLM it was (sliding_window null), while the
same model of no recorded origin exports as Llama's; a bad window and a windowed model with biases are refused in
one line."""
import json

import pytest
import torch

from megatron.checkpoint.reshape.target_writer import TargetLayout
from megatron.config.model_config import ModelConfig
from megatron.errors import InputError
from megatron.families.llama import hf_adapter as llama
from megatron.families.mistral import hf_adapter as mistral
from megatron.families.registry import family_of_model
from megatron.hf import files as hf_files
from megatron.hf.conversions import export_hf, import_hf
from megatron.hf.examine import examine
from tests.families.llama.test_hf_adapter import our_model
from tests.helpers.hf_imports import (TP2_AND_TP2PP2, assert_exported_back, assert_greedy_as_generate,
                                     assert_transformers_logits, config_json, exported_and_original, import_at,
                                     saved_sharded, seeded_model)

VOCAB = 100
WINDOW = 4  # transformers' sliding_window: our window_size 3
SHAPE = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2,
             rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, sliding_window=WINDOW)


def mistral_model(**overrides):
    from transformers import MistralConfig, MistralForCausalLM

    return seeded_model(MistralForCausalLM, MistralConfig, SHAPE, **overrides)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return saved_sharded(mistral_model(), tmp_path_factory, "mistral")


@pytest.fixture(scope="module")
def imported(hf_dir, tmp_path_factory):
    return import_at(hf_dir, tmp_path_factory, TP2_AND_TP2PP2)


@pytest.mark.parametrize("layout", ["tp2", "tp2pp2"])
def test_imported_mistral_computes_transformers_logits_and_exports_back_bit_for_bit(hf_dir, imported, layout,
                                                                                      tmp_path):
    from transformers import MistralForCausalLM

    reference = MistralForCausalLM.from_pretrained(hf_dir).eval()
    model = our_model(imported[layout])
    assert (model.config.window_size, model.config.add_bias_linear, model.config.rope_theta) == (WINDOW - 1, False,
                                                                                                  1000000)
    tokens = assert_transformers_logits(model, reference, VOCAB)
    exported = str(tmp_path / "exported")
    assert_exported_back(imported[layout], hf_dir, exported, reference, tokens, max_shard_bytes=30_000)
    after = config_json(exported)
    assert after["sliding_window"] == WINDOW and after["architectures"] == ["MistralForCausalLM"]


def test_greedy_generation_past_the_window_with_the_kv_cache_equals_transformers_generate(hf_dir, imported):
    from transformers import MistralForCausalLM

    reference = MistralForCausalLM.from_pretrained(hf_dir).eval()
    prompts = [[5, 9, 2, 7, 1, 33, 61, 12, 40], [3, 8]]  # 9 tokens: longer than the window; 2: shorter
    assert_greedy_as_generate(our_model(imported["tp2pp2"]), reference, prompts, VOCAB)


def test_windowless_mistral_with_its_own_head_size_imports_and_comes_back_as_mistral(tmp_path):
    """v0.3 without a window, and Mistral Nemo's head_dim other than hidden / heads (--kv-channels): Llama's class
    holds the same model, but the import recorded the class it came from."""
    from transformers import AutoModelForCausalLM, LlamaForCausalLM, MistralForCausalLM

    reference = mistral_model(sliding_window=None, head_dim=16)
    reference.save_pretrained(tmp_path / "hf")
    import_hf(str(tmp_path / "hf"), str(tmp_path / "ckpt"), TargetLayout(2, 2), make_vocab_size_divisible_by=16)
    model = our_model(str(tmp_path / "ckpt"))
    assert (model.config.window_size, model.config.kv_channels) == (None, 16)
    tokens = assert_transformers_logits(model, reference, VOCAB, seed=2)
    written, original = exported_and_original(str(tmp_path / "ckpt"), tmp_path / "hf", str(tmp_path / "out"))
    assert written.keys() == original.keys() and all(torch.equal(written[name], original[name]) for name in original)
    after = config_json(tmp_path / "out")
    assert [after[key] for key in ("architectures", "model_type", "sliding_window", "head_dim")] == [
        ["MistralForCausalLM"], "mistral", None, 16]
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert isinstance(loaded, MistralForCausalLM) and loaded.config.sliding_window is None
    with torch.no_grad():
        assert torch.equal(loaded(tokens).logits, reference(tokens).logits)
    shown = examine(str(tmp_path / "hf"))
    assert shown.header[0].startswith("Hugging Face MistralForCausalLM model")
    assert "sliding window: none" in shown.header
    # --hf-architecture picks another class that holds the model, and refuses one that cannot
    export_hf(str(tmp_path / "ckpt"), str(tmp_path / "as_llama"), architecture=llama.ARCHITECTURE)
    assert config_json(tmp_path / "as_llama")["architectures"] == [llama.ARCHITECTURE]
    with torch.no_grad():
        assert torch.equal(LlamaForCausalLM.from_pretrained(tmp_path / "as_llama").eval()(tokens).logits,
                           reference(tokens).logits)
    with pytest.raises(InputError, match=r"^--hf-architecture Qwen2ForCausalLM: \S*ckpt holds a model with .*, "
                                         r"which that class cannot hold \(Qwen2 needs .*\); leave the flag out to "
                                         r"write MistralForCausalLM$"):
        export_hf(str(tmp_path / "ckpt"), str(tmp_path / "as_qwen2"), architecture="Qwen2ForCausalLM")
    assert not (tmp_path / "as_qwen2").exists()


def test_a_window_that_is_no_count_of_keys_is_refused_in_one_line(tmp_path):
    mistral_model().save_pretrained(tmp_path / "hf")
    path = tmp_path / "hf" / hf_files.CONFIG_FILE
    path.write_text(json.dumps({**json.loads(path.read_text()), "sliding_window": 0}))
    with pytest.raises(InputError, match=r"^\S*config.json sets sliding_window 0; it must be a whole number of keys, "
                                         r"1 or more, or null for none$"):
        import_hf(str(tmp_path / "hf"), str(tmp_path / "out"), TargetLayout(1, 1))
    assert not (tmp_path / "out").exists()


def test_a_windowed_model_is_mistrals_and_with_biases_nobodys():
    flags = {**mistral.MISTRAL_FLAGS, "num_layers": 2, "hidden_size": 32, "num_attention_heads": 4,
             "max_position_embeddings": 16, "window_size": 7}
    model = ModelConfig.from_flags(flags)
    assert mistral.holds(model) and not llama.holds(model)
    assert family_of_model(model, "ckpt").name == "mistral"
    windowless = ModelConfig.from_flags({**flags, "window_size": None})
    assert family_of_model(windowless, "ckpt").name == "llama"
    assert family_of_model(windowless, "ckpt", mistral.ARCHITECTURE).name == "mistral"
    assert family_of_model(model, "ckpt", llama.ARCHITECTURE).name == "mistral"  # a class that cannot hold it
    with pytest.raises(InputError, match=r"^--to-hf: ckpt holds a model with .*--window-size 7.*Mistral needs "):
        family_of_model(ModelConfig.from_flags({**flags, "add_bias_linear": True}), "ckpt")
