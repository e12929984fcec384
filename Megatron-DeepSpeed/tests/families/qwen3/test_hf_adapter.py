"""Hugging Face Qwen3 in and out: a seeded random transformers Qwen3ForCausalLM (GQA 4:2, heads of 16 channels
at hidden 32, random per-head q/k norms, untied head, sharded safetensors) imports at TP 2 and at TP 2 x PP 2,
computes transformers' logits, continues prompts greedily as transformers' generate does (our KV cache), and
exports back bit for bit with the same config; attention_bias is refused in one line; our model with
--qk-layernorm exports as Qwen3 and Llama's adapter does not take it."""
import json

import pytest

from megatron.hf import files as hf_files
from megatron.hf.conversions import import_hf
from megatron.hf.examine import examine
from megatron.checkpoint.reshape.target_writer import TargetLayout
from megatron.config.model_config import ModelConfig
from megatron.errors import InputError
from megatron.families.llama import hf_adapter as llama
from megatron.families.qwen3 import hf_adapter as qwen3
from megatron.families.registry import family_of_model
from tests.families.llama.test_hf_adapter import our_model
from tests.helpers.hf_imports import (TP2_AND_TP2PP2, assert_exported_back, assert_greedy_as_generate,
                                     assert_transformers_logits, import_at, saved_sharded, seeded_model)

VOCAB = 100
SHAPE = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=64, rms_norm_eps=1e-6, bos_token_id=1,
             eos_token_id=2, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
             tie_word_embeddings=False)


def qwen3_model(**overrides):
    """Random norms: the per-head q/k ones too."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    return seeded_model(Qwen3ForCausalLM, Qwen3Config, SHAPE, **overrides)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return saved_sharded(qwen3_model(), tmp_path_factory, "qwen3")


@pytest.fixture(scope="module")
def imported(hf_dir, tmp_path_factory):
    return import_at(hf_dir, tmp_path_factory, TP2_AND_TP2PP2)


@pytest.mark.parametrize("layout", ["tp2", "tp2pp2"])
def test_imported_qwen3_computes_transformers_logits_and_exports_back_bit_for_bit(hf_dir, imported, layout, tmp_path):
    from transformers import Qwen3ForCausalLM

    reference = Qwen3ForCausalLM.from_pretrained(hf_dir).eval()
    model = our_model(imported[layout])
    assert (model.config.kv_channels, model.config.qk_layernorm, model.config.add_bias_linear) == (16, True, False)
    assert model.layers[0].self_attention.q_norm.weight.shape == (16,)
    tokens = assert_transformers_logits(model, reference, VOCAB)
    exported = str(tmp_path / "exported")
    written = assert_exported_back(imported[layout], hf_dir, exported, reference, tokens, max_shard_bytes=30_000)
    assert any(name.endswith("k_norm.weight") for name in written)
    shown = examine(exported)
    assert "heads of 16 channels, queries and keys RMS-normalised per head" in shown.header


def test_greedy_generation_with_the_kv_cache_equals_transformers_generate(hf_dir, imported):
    from transformers import Qwen3ForCausalLM

    reference = Qwen3ForCausalLM.from_pretrained(hf_dir).eval()
    assert_greedy_as_generate(our_model(imported["tp2pp2"]), reference, [[5, 9, 2, 7, 1, 33, 61], [3, 8]], VOCAB)


def test_attention_bias_is_refused_in_one_line(tmp_path):
    qwen3_model().save_pretrained(tmp_path / "hf")
    path = tmp_path / "hf" / hf_files.CONFIG_FILE
    path.write_text(json.dumps({**json.loads(path.read_text()), "attention_bias": True}))
    with pytest.raises(InputError, match=r"^\S*config.json sets attention_bias, which adds biases to the attention's "
                                         r"four projections only; that is not implemented here"):
        import_hf(str(tmp_path / "hf"), str(tmp_path / "out"), TargetLayout(1, 1))
    assert not (tmp_path / "out").exists()


def test_a_model_with_qk_norms_is_qwen3s_not_llamas():
    flags = {**qwen3.QWEN3_FLAGS, "num_layers": 2, "hidden_size": 32, "num_attention_heads": 4,
             "max_position_embeddings": 16, "kv_channels": 16}
    model = ModelConfig.from_flags(flags)
    assert qwen3.holds(model) and not llama.holds(model)
    assert family_of_model(model, "ckpt").name == "qwen3"
    # without the norms, a head size of its own is Llama's (head_dim)
    assert family_of_model(ModelConfig.from_flags({**flags, "qk_layernorm": False}), "ckpt").name == "llama"
