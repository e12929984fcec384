"""Hugging Face Qwen2 in and out: a seeded random transformers Qwen2ForCausalLM (GQA 4:2, rope_theta 1e6, random
q/k/v biases, untied head, sharded safetensors) imports at TP 2 and at TP 2 x PP 2, computes transformers' logits,
continues prompts greedily as transformers' generate does (our KV cache), and exports back bit for bit with the
same config; a tied one round-trips; sliding-window attention is refused in one line; our Llama-shaped model with
--add-qkv-bias exports as Qwen2 and Llama's adapter does not take it."""

import pytest
import torch

from megatron.hf.conversions import import_hf
from megatron.hf.examine import examine
from megatron.checkpoint.reshape.target_writer import TargetLayout
from megatron.config.model_config import ModelConfig
from megatron.errors import InputError
from megatron.families.llama import hf_adapter as llama
from megatron.families.qwen2 import hf_adapter as qwen2
from megatron.families.registry import family_of_model
from tests.helpers.hf_imports import (TP2_AND_TP2PP2, assert_exported_back, assert_greedy_as_generate,
                                     assert_transformers_logits, config_json, exported_and_original, import_at,
                                     saved_sharded, seeded_model)
from tests.families.llama.test_hf_adapter import our_model

VOCAB = 100
SHAPE = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2)


def qwen2_model(**overrides):
    """A seeded Qwen2ForCausalLM with random norms and q/k/v biases."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return seeded_model(Qwen2ForCausalLM, Qwen2Config, SHAPE, **{
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}, "tie_word_embeddings": False,
        **overrides})


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return saved_sharded(qwen2_model(), tmp_path_factory, "qwen2")


@pytest.fixture(scope="module")
def imported(hf_dir, tmp_path_factory):
    return import_at(hf_dir, tmp_path_factory, TP2_AND_TP2PP2)


@pytest.mark.parametrize("layout", ["tp2", "tp2pp2"])
def test_imported_qwen2_computes_transformers_logits_and_exports_back_bit_for_bit(hf_dir, imported, layout, tmp_path):
    from transformers import Qwen2ForCausalLM

    reference = Qwen2ForCausalLM.from_pretrained(hf_dir).eval()
    model = our_model(imported[layout])
    assert (model.config.add_qkv_bias, model.config.add_bias_linear, model.config.rope_theta) == (True, False, 1000000)
    layer = model.layers[0]
    assert layer.self_attention.query_key_value.bias is not None and layer.mlp.dense_4h_to_h.bias is None
    tokens = assert_transformers_logits(model, reference, VOCAB)
    written = assert_exported_back(imported[layout], hf_dir, str(tmp_path / "exported"), reference, tokens,
                                   max_shard_bytes=30_000)
    assert any(name.endswith("k_proj.bias") for name in written)


def test_greedy_generation_with_the_kv_cache_equals_transformers_generate(hf_dir, imported):
    from transformers import Qwen2ForCausalLM

    reference = Qwen2ForCausalLM.from_pretrained(hf_dir).eval()
    assert_greedy_as_generate(our_model(imported["tp2pp2"]), reference, [[5, 9, 2, 7, 1, 33, 61], [3, 8]], VOCAB)


def test_tied_qwen2_round_trips_and_the_examiner_shows_its_biases(tmp_path):
    from transformers import Qwen2ForCausalLM

    reference = qwen2_model(vocab_size=70, tie_word_embeddings=True)
    reference.save_pretrained(tmp_path / "hf")
    import_hf(str(tmp_path / "hf"), str(tmp_path / "ckpt"), TargetLayout(2, 2), make_vocab_size_divisible_by=16)
    model = our_model(str(tmp_path / "ckpt"))
    assert not model.config.untie_embeddings_and_output_weights
    tokens = assert_transformers_logits(model, reference, 70, seed=2)
    written, original = exported_and_original(str(tmp_path / "ckpt"), tmp_path / "hf", str(tmp_path / "out"))
    original.pop("lm_head.weight", None)  # tied: transformers may or may not store it
    assert written.keys() == original.keys() and all(torch.equal(written[name], original[name]) for name in original)
    assert config_json(tmp_path / "out")["tie_word_embeddings"] is True
    with torch.no_grad():
        assert torch.equal(Qwen2ForCausalLM.from_pretrained(tmp_path / "out").eval()(tokens).logits,
                           reference(tokens).logits)
    shown = examine(str(tmp_path / "out"))
    assert shown.header[0].startswith("Hugging Face Qwen2ForCausalLM model")
    assert "biases: query, key and value projections only" in shown.header


def test_sliding_window_attention_is_refused_in_one_line(tmp_path):
    qwen2_model(use_sliding_window=True, sliding_window=8, max_window_layers=1).save_pretrained(tmp_path / "hf")
    with pytest.raises(InputError, match=r"^\S*config.json turns on sliding-window attention \(use_sliding_window / "
                                         r"layer_types 'sliding_attention'\), which is not implemented here; only full "
                                         r"attention in every layer can be imported$"):
        import_hf(str(tmp_path / "hf"), str(tmp_path / "out"), TargetLayout(1, 1))
    assert not (tmp_path / "out").exists()


def test_a_llama_shaped_model_with_qkv_biases_is_qwen2s_not_llamas():
    flags = {**qwen2.QWEN2_FLAGS, "num_layers": 2, "hidden_size": 32, "num_attention_heads": 4,
             "max_position_embeddings": 16}
    model = ModelConfig.from_flags(flags)
    assert qwen2.holds(model) and not llama.holds(model)
    assert family_of_model(model, "ckpt").name == "qwen2"
    assert family_of_model(ModelConfig.from_flags({**flags, "add_qkv_bias": False}), "ckpt").name == "llama"
