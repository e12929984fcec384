"""The npu_fusion_attention call of deepspeed_npu against the operator's schema (op-plugin's
op_plugin_functions.yaml, commit 517f2e7d0f202f38b76310706cb977ca2388ad21, copied into the stand-in's SCHEMA):
argument order and names, the BSND layout the model's projections already have, grouped key/value heads,
True-is-masked polarity and sparse_mode, for training with and without an explicit mask. The stand-in's signature is checked against the schema first, so it cannot drift from it."""
import math

import pytest
import torch
from npu_fusion_attention_stand_in import COMPRESSED_CAUSAL, SCHEMA, NpuFusionAttentionStandIn
from npu_schemas import schema_parameters, signature_parameters

from deepspeed_npu.fused_kernels import FusionAttention
from megatron.model.kernels import sdpa_attention


def test_the_stand_in_has_the_schemas_signature():
    assert signature_parameters(NpuFusionAttentionStandIn().__call__) == schema_parameters(SCHEMA)


def inputs(seq=6, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 3, seq, 8, generator=generator, dtype=torch.float64) for _ in range(3)]


def test_causal_training_call():
    kernel = NpuFusionAttentionStandIn()
    query, key, value = inputs()
    output = FusionAttention(kernel)(query, key, value, None, 0.0)
    torch.testing.assert_close(output, sdpa_attention(query, key, value, None, 0.0))
    [call] = kernel.calls
    assert (call["head_num"], call["input_layout"], call["sparse_mode"], call["keep_prob"]) == (3, "BSND", 2, 1.0)
    assert torch.equal(call["atten_mask"], COMPRESSED_CAUSAL) and call["pse"] is None
    assert call["scale"] == pytest.approx(1 / math.sqrt(8))


def test_explicit_mask_training_call():
    kernel = NpuFusionAttentionStandIn()
    query, key, value = inputs(seed=1)
    mask = torch.ones(6, 6, dtype=torch.bool).triu(1)
    mask[3:, :3] = True  # two documents: no attending across the boundary (Megatron: True = may not attend)
    mask = mask.expand(2, 1, 6, 6)
    output = FusionAttention(kernel)(query, key, value, mask, 0.0)
    torch.testing.assert_close(output, sdpa_attention(query, key, value, mask, 0.0))
    [call] = kernel.calls
    assert call["sparse_mode"] == 0 and call["atten_mask"] is mask  # same polarity: passed through unchanged


def test_dropout_probability_becomes_keep_probability():
    kernel = NpuFusionAttentionStandIn()
    query, key, value = inputs()
    FusionAttention(kernel)(query, key, value, None, 0.1)
    assert kernel.calls[0]["keep_prob"] == pytest.approx(0.9)


def test_a_call_the_schema_does_not_have_fails():
    query, key, value = inputs()
    with pytest.raises(TypeError):
        NpuFusionAttentionStandIn()(query, key, value, 3, "BNSD", attn_mask=None)  # torch's spelling, not the op's


def test_grouped_key_value_heads_go_to_the_operator_unrepeated():
    """The operator takes Nq a whole multiple of Nkv (its documentation's GQA): key/value keep their 2 heads, and
    the result is attention over each query head's group."""
    kernel = NpuFusionAttentionStandIn()
    generator = torch.Generator().manual_seed(2)
    query = torch.randn(2, 4, 6, 8, generator=generator, dtype=torch.float64)
    key, value = (torch.randn(2, 2, 6, 8, generator=generator, dtype=torch.float64) for _ in range(2))
    output = FusionAttention(kernel)(query, key, value, None, 0.0)
    repeated = [tensor.repeat_interleave(2, dim=1) for tensor in (key, value)]
    torch.testing.assert_close(output, sdpa_attention(query, *repeated, None, 0.0))
    assert FusionAttention.takes_grouped_kv and kernel.calls[0]["key_heads"] == 2


def test_the_output_comes_back_as_a_view_the_model_flattens_without_a_copy():
    """BSND out, handed back as a BNSD view: the model's context.transpose(1, 2) is then contiguous, so its
    reshape to [batch, seq, hidden] copies nothing (a BNSD output would be copied there on every call)."""
    query, key, value = inputs()
    output = FusionAttention(NpuFusionAttentionStandIn())(query, key, value, None, 0.0)
    assert output.shape == query.shape and output.transpose(1, 2).is_contiguous()
