"""A recording stand-in for torch_npu.npu_fusion_attention whose Python signature is the operator's schema.

SCHEMA is the operator's declaration in Ascend/op-plugin, op_plugin/config/op_plugin_functions.yaml at commit
517f2e7d0f202f38b76310706cb977ca2388ad21 (section `custom`, exposed for torch 2.1 and newer);
test_npu_fusion_attention_contract.py checks that the stand-in's signature says the same. A call with a
misspelt or unknown keyword, or a positional argument out of place, fails here as it would on the device.
The arithmetic follows the operator's documentation (docs/zh/custom_APIs/torch_npu/
torch_npu-npu_fusion_attention.md, same commit): atten_mask True (1) = position not computed; query, key and
value in one of the layouts BNSD or BSND (the doc also lists BSH, SBH, TND, unused here), the output in the same;
key/value may have fewer heads than the query (Nq a whole multiple of Nkv: grouped-query attention), head_num being
the query's; sparse_mode 0 takes the mask as given, 2 (leftUpCausal) reads causality from a 2048 x 2048 compressed
triu(1) mask; masks are bool or uint8 of shape BNSS, B1SS, 11SS or SS.
"""
import torch

SCHEMA = ("npu_fusion_attention(Tensor query, Tensor key, Tensor value, int head_num, str input_layout, "
          "Tensor? pse=None, Tensor? padding_mask=None, Tensor? atten_mask=None, float scale=1., "
          "float keep_prob=1., int pre_tockens=2147483647, int next_tockens=2147483647, int inner_precise=0, "
          "int[]? prefix=None, int[]? actual_seq_qlen=None, int[]? actual_seq_kvlen=None, int sparse_mode=0, "
          "bool gen_mask_parallel=True, bool sync=False, str softmax_layout=\"\", Tensor? sink=None, "
          "Tensor? dropout_mask=None, int seed=0, int offset=0) -> (Tensor, Tensor, Tensor, Tensor, int, int, int)")
COMPRESSED_CAUSAL = torch.ones(2048, 2048, dtype=torch.bool).triu(1)


class NpuFusionAttentionStandIn:
    def __init__(self):
        self.calls = []

    def __call__(self, query, key, value, head_num, input_layout, pse=None, padding_mask=None, atten_mask=None,
                 scale=1., keep_prob=1., pre_tockens=2147483647, next_tockens=2147483647, inner_precise=0,
                 prefix=None, actual_seq_qlen=None, actual_seq_kvlen=None, sparse_mode=0, gen_mask_parallel=True,
                 sync=False, softmax_layout="", sink=None, dropout_mask=None, seed=0, offset=0):
        assert input_layout in ("BNSD", "BSND")
        if input_layout == "BSND":
            query, key, value = (tensor.transpose(1, 2) for tensor in (query, key, value))
        self.calls.append(dict(head_num=head_num, input_layout=input_layout, pse=pse, atten_mask=atten_mask,
                               scale=scale, keep_prob=keep_prob, sparse_mode=sparse_mode,
                               key_heads=key.shape[1]))
        assert head_num == query.shape[1] and key.shape == value.shape and head_num % key.shape[1] == 0
        key, value = (tensor.repeat_interleave(head_num // key.shape[1], dim=1) for tensor in (key, value))
        assert atten_mask is None or atten_mask.dtype in (torch.bool, torch.uint8)
        if sparse_mode == 2:
            assert torch.equal(atten_mask.cpu(), COMPRESSED_CAUSAL)
            masked = torch.ones(query.shape[2], key.shape[2], dtype=torch.bool).triu(1)
        else:
            assert sparse_mode == 0
            if atten_mask is not None:
                assert atten_mask.shape[-2:] == (query.shape[2], key.shape[2]) and atten_mask.dim() in (2, 4)
                assert atten_mask.dim() == 2 or (atten_mask.shape[0] in (1, query.shape[0])
                                                 and atten_mask.shape[1] in (1, head_num))
            masked = None if atten_mask is None else atten_mask.bool()
        scores = (query @ key.transpose(-1, -2)) * scale
        if masked is not None:
            scores = scores.masked_fill(masked, float("-inf"))
        probabilities = torch.nn.functional.dropout(scores.softmax(dim=-1), p=1.0 - keep_prob)
        softmax_statistics = scores.amax(dim=-1)
        output = probabilities @ value
        if input_layout == "BSND":
            output = output.transpose(1, 2).contiguous()
        return output, softmax_statistics, softmax_statistics, torch.empty(0), 0, 0, 0
