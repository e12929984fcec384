"""The npu_fusion_attention call of deepspeed_npu against the operator's schema (op-plugin's
op_plugin_functions.yaml, commit 517f2e7d0f202f38b76310706cb977ca2388ad21, copied into the stand-in's SCHEMA):
argument order and names, the BSND layout the model's projections already have and the TND layout of packed
documents, grouped key/value heads, sparse_mode and its band and varlen arguments, for each case of the attention
spec: causal, sliding window, packed documents, both. The stand-in's signature is checked against the schema first,
so it cannot drift from it."""
import math

import pytest
import torch
from npu_fusion_attention_stand_in import COMPRESSED_CAUSAL, SCHEMA, NpuFusionAttentionStandIn
from npu_schemas import schema_parameters, signature_parameters

from deepspeed_npu.fused_kernels import FusionAttention
from megatron.model.attention_spec import AttentionSpec
from megatron.model.kernels import sdpa_attention


def test_the_stand_in_has_the_schemas_signature():
    assert signature_parameters(NpuFusionAttentionStandIn().__call__) == schema_parameters(SCHEMA)


def inputs(seq=6, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 3, seq, 8, generator=generator, dtype=torch.float64) for _ in range(3)]


DOCUMENTS = torch.tensor([[0, 0, 0, 1, 1, 1], [0, 1, 1, 1, 1, 2]])  # packed: rows of three and two documents


def test_causal_training_call():
    kernel = NpuFusionAttentionStandIn()
    query, key, value = inputs()
    output = FusionAttention(kernel)(query, key, value, AttentionSpec())
    torch.testing.assert_close(output, sdpa_attention(query, key, value, AttentionSpec()))
    [call] = kernel.calls
    assert (call["head_num"], call["input_layout"], call["sparse_mode"], call["keep_prob"]) == (3, "BSND", 2, 1.0)
    assert torch.equal(call["atten_mask"], COMPRESSED_CAUSAL) and call["pse"] is None
    assert call["scale"] == pytest.approx(1 / math.sqrt(8))


def test_sliding_window_is_the_band_mode():
    kernel = NpuFusionAttentionStandIn()
    query, key, value = inputs(seed=1)
    spec = AttentionSpec(window_size=2)  # each query: itself and the two keys before
    torch.testing.assert_close(FusionAttention(kernel)(query, key, value, spec),
                               sdpa_attention(query, key, value, spec))
    [call] = kernel.calls
    assert (call["input_layout"], call["sparse_mode"], call["pre_tockens"], call["next_tockens"]) == ("BSND", 4, 2, 0)
    assert torch.equal(call["atten_mask"], COMPRESSED_CAUSAL)


@pytest.mark.parametrize("window, sparse_mode", [(None, 3), (1, 4)])
def test_packed_documents_are_varlen_sequences_of_the_tnd_layout(window, sparse_mode):
    kernel = NpuFusionAttentionStandIn()
    query, key, value = inputs(seed=2)
    spec = AttentionSpec(window_size=window, segment_ids=DOCUMENTS, softmax_scale=0.3)
    torch.testing.assert_close(FusionAttention(kernel)(query, key, value, spec),
                               sdpa_attention(query, key, value, spec))
    [call] = kernel.calls
    assert (call["input_layout"], call["sparse_mode"], call["scale"]) == ("TND", sparse_mode, 0.3)
    assert call["actual_seq_qlen"] == call["actual_seq_kvlen"] == [3, 6, 7, 11, 12]  # cumulative ends, rows end to end
    assert torch.equal(call["atten_mask"], COMPRESSED_CAUSAL)  # a fixed 2048 x 2048 mask, whatever the lengths


def test_more_documents_than_the_varlen_layout_takes_is_refused_in_one_line():
    query = key = value = torch.zeros(1, 3, 1025, 8)
    spec = AttentionSpec(segment_ids=torch.arange(1025)[None])  # one-token documents
    with pytest.raises(ValueError, match=r"^1025 documents in one micro-batch; .* takes at most 1024: lower"):
        FusionAttention(NpuFusionAttentionStandIn())(query, key, value, spec)


def test_dropout_probability_becomes_keep_probability():
    kernel = NpuFusionAttentionStandIn()
    query, key, value = inputs()
    FusionAttention(kernel)(query, key, value, AttentionSpec(dropout_p=0.1))
    assert kernel.calls[0]["keep_prob"] == pytest.approx(0.9)


def test_fewer_queries_than_keys_is_refused_in_one_line():
    query, key, value = inputs()
    with pytest.raises(ValueError, match="training kernel: queries and keys must cover the same positions"):
        FusionAttention(NpuFusionAttentionStandIn())(query[:, :, -1:], key, value, AttentionSpec())


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
    output = FusionAttention(kernel)(query, key, value, AttentionSpec())
    repeated = [tensor.repeat_interleave(2, dim=1) for tensor in (key, value)]
    torch.testing.assert_close(output, sdpa_attention(query, *repeated, AttentionSpec()))
    assert FusionAttention.takes_grouped_kv and kernel.calls[0]["key_heads"] == 2


def test_the_output_comes_back_as_a_view_the_model_flattens_without_a_copy():
    """BSND out, handed back as a BNSD view: the model's context.transpose(1, 2) is then contiguous, so its
    reshape to [batch, seq, hidden] copies nothing (a BNSD output would be copied there on every call)."""
    query, key, value = inputs()
    output = FusionAttention(NpuFusionAttentionStandIn())(query, key, value, AttentionSpec())
    assert output.shape == query.shape and output.transpose(1, 2).is_contiguous()
