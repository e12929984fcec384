"""A recording stand-in for torch_npu.npu_fusion_attention whose Python signature is the operator's schema.

SCHEMA is the operator's declaration in Ascend/op-plugin, op_plugin/config/op_plugin_functions.yaml at commit
517f2e7d0f202f38b76310706cb977ca2388ad21 (section `custom`, exposed for torch 2.1 and newer);
test_npu_fusion_attention_contract.py checks that the stand-in's signature says the same. A call with a
misspelt or unknown keyword, or a positional argument out of place, fails here as it would on the device.
The arithmetic follows the operator's documentation (docs/zh/custom_APIs/torch_npu/
torch_npu-npu_fusion_attention.md, same commit): atten_mask True (1) = position not computed; query, key and
value in one of the layouts BNSD, BSND or TND (TND: the varlen case, actual_seq_qlen / actual_seq_kvlen the
cumulative ends of the sequences laid end to end, e.g. lengths 2 2 2 -> [2, 4, 6], each sequence attending within
itself; the doc also lists BSH and SBH, unused here), the output in the same; key/value may have fewer heads than
the query (Nq a whole multiple of Nkv: grouped-query attention), head_num being the query's; sparse_mode 0 takes
the mask as given (None: every key), 2 (leftUpCausal) and 3 (rightDownCausal) read causality from a 2048 x 2048
compressed triu(1) mask, counted from the top-left or the bottom-right corner, and 4 (band) computes the keys from
pre_tockens before to next_tockens after each query, counted from the bottom-right corner, with the same
compressed mask; masks are bool or uint8 of shape BNSS, B1SS, 11SS or SS (varlen: SS only).
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
        assert input_layout in ("BNSD", "BSND", "TND")
        self.calls.append(dict(head_num=head_num, input_layout=input_layout, pse=pse, atten_mask=atten_mask,
                               scale=scale, keep_prob=keep_prob, sparse_mode=sparse_mode, pre_tockens=pre_tockens,
                               next_tockens=next_tockens, actual_seq_qlen=actual_seq_qlen,
                               actual_seq_kvlen=actual_seq_kvlen, key_heads=key.shape[-2 if input_layout == "BSND"
                                                                                     else 1]))
        assert atten_mask is None or atten_mask.dtype in (torch.bool, torch.uint8)
        if input_layout == "TND":
            assert query.dim() == 3 and head_num == query.shape[1] and actual_seq_qlen and actual_seq_kvlen
            assert actual_seq_qlen[-1] == query.shape[0] and actual_seq_kvlen[-1] == key.shape[0]
            assert atten_mask is None or atten_mask.dim() == 2
            bounds = zip([0, *actual_seq_qlen[:-1]], actual_seq_qlen, [0, *actual_seq_kvlen[:-1]], actual_seq_kvlen)
            outputs = [self._attend(_bnsd(query[q0:q1]), _bnsd(key[k0:k1]), _bnsd(value[k0:k1]), atten_mask, scale,
                                    keep_prob, pre_tockens, next_tockens, sparse_mode)[0].transpose(0, 1)
                       for q0, q1, k0, k1 in bounds]
            context = torch.cat(outputs)
        else:
            if input_layout == "BSND":
                query, key, value = (tensor.transpose(1, 2) for tensor in (query, key, value))
            assert head_num == query.shape[1]
            context = self._attend(query, key, value, atten_mask, scale, keep_prob, pre_tockens, next_tockens,
                                   sparse_mode)
            if input_layout == "BSND":
                context = context.transpose(1, 2).contiguous()
        statistics = torch.empty(0)
        return context, statistics, statistics, torch.empty(0), 0, 0, 0

    @staticmethod
    def _attend(query, key, value, atten_mask, scale, keep_prob, pre_tockens, next_tockens, sparse_mode):
        """[B, N, Sq, D] attention by the sparse_mode rule; grouped-query key/value repeated to the query's heads."""
        assert key.shape == value.shape and query.shape[1] % key.shape[1] == 0
        key, value = (tensor.repeat_interleave(query.shape[1] // key.shape[1], dim=1) for tensor in (key, value))
        queries, keys = query.shape[2], key.shape[2]
        offset = torch.arange(keys)[None, :] - torch.arange(queries)[:, None]  # key - query, top-left origin
        if sparse_mode in (2, 3, 4):
            assert torch.equal(atten_mask.cpu(), COMPRESSED_CAUSAL)
            bottom_right = offset - (keys - queries)
            masked = {2: offset > 0, 3: bottom_right > 0,
                      4: (bottom_right < -pre_tockens) | (bottom_right > next_tockens)}[sparse_mode]
        else:
            assert sparse_mode == 0
            if atten_mask is not None:
                assert atten_mask.shape[-2:] == (queries, keys) and atten_mask.dim() in (2, 4)
                assert atten_mask.dim() == 2 or (atten_mask.shape[0] in (1, query.shape[0])
                                                 and atten_mask.shape[1] in (1, query.shape[1]))
            masked = None if atten_mask is None else atten_mask.bool()
        scores = (query @ key.transpose(-1, -2)) * scale
        if masked is not None:
            scores = scores.masked_fill(masked, float("-inf"))
        probabilities = torch.nn.functional.dropout(scores.softmax(dim=-1), p=1.0 - keep_prob)
        return probabilities @ value


def _bnsd(sequence):
    """One TND sequence [S, N, D] as a batch of one [1, N, S, D]."""
    return sequence.transpose(0, 1)[None]
