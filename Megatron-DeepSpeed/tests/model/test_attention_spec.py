"""Every attention implementation against attention by hand with a mask drawn position by position (fp32, 1e-5):
causal, a sliding window, packed documents and both, with as many queries as keys and (generation's KV cache)
fewer; gradients too where the implementation trains on a CPU. The NPU fusion attention has its own contract test
(DeepSpeed/tests/test_npu_fusion_attention_contract.py) and Ulysses its multi-process one
(tests/model/test_ulysses.py)."""
import numpy as np
import pytest
import torch
from tests.helpers.distributed import run_on_ranks
from tests.helpers.training import COMMON, VOCAB, assert_same_training, train

from megatron.data.indexed_dataset import MMapIndexedDatasetBuilder
from megatron.errors import InputError
from megatron.model.attention_spec import AttentionSpec
from megatron.model.kernels import FlexAttention, sdpa_attention
from megatron.model.parallelize import RNGForkedAttention
from megatron.model.unfused_attention import UnfusedAttention
from megatron.tensor_parallel import tensor_parallel_rng_tracker

SEGMENTS = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 2, 2, 2], [0, 0, 0, 0, 0, 0, 0, 0, 1, 1]])
CASES = {"causal": dict(), "window": dict(window_size=2), "segments": dict(segment_ids=SEGMENTS),
         "window+segments": dict(window_size=1, segment_ids=SEGMENTS), "scale": dict(softmax_scale=0.2)}


def by_hand(query, key, value, window=None, segments=None, scale=None):
    """Softmax attention with a mask written out query by query; the queries are the last of the keys."""
    queries, keys = query.shape[-2], key.shape[-2]
    visible = torch.zeros(query.shape[0], queries, keys, dtype=torch.bool)
    for row in range(query.shape[0]):
        for q in range(queries):
            i = keys - queries + q
            for j in range(keys):
                visible[row, q, j] = (j <= i and (window is None or i - j <= window)
                                      and (segments is None or segments[row, i] == segments[row, j]))
    scores = query @ key.transpose(-1, -2) * (scale or query.shape[-1] ** -0.5)
    return scores.masked_fill(~visible[:, None], float("-inf")).softmax(-1) @ value


def inputs(queries=10, seed=0, grad=False):
    generator = torch.Generator().manual_seed(seed)
    query, key, value = (torch.randn(2, 3, 10, 8, generator=generator) for _ in range(3))
    return [t.requires_grad_(grad) for t in (query[:, :, 10 - queries:].contiguous(), key, value)]


def expected_of(case, query, key, value):
    options = CASES[case]
    return by_hand(query, key, value, options.get("window_size"), options.get("segment_ids"),
                   options.get("softmax_scale"))


TRAINING_KERNELS = {
    "sdpa": sdpa_attention,
    "unfused": UnfusedAttention(layer_number=1, apply_query_key_layer_scaling=False, softmax_in_fp32=False),
    "unfused-layer-scaling": UnfusedAttention(layer_number=5, apply_query_key_layer_scaling=True,
                                              softmax_in_fp32=True),
    "rng-forked": RNGForkedAttention(sdpa_attention, tensor_parallel_rng_tracker(3, 0)),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", TRAINING_KERNELS)
def test_kernels_equal_attention_by_hand_with_gradients(name, case):
    query, key, value = inputs(grad=True)
    output = TRAINING_KERNELS[name](query, key, value, AttentionSpec(**CASES[case]))
    grads = torch.autograd.grad(output.square().sum(), (query, key, value))
    reference = inputs(grad=True)
    expected = expected_of(case, *reference)
    expected_grads = torch.autograd.grad(expected.square().sum(), reference)
    torch.testing.assert_close(output, expected, rtol=1e-5, atol=1e-5)
    for grad, expected_grad in zip(grads, expected_grads):
        torch.testing.assert_close(grad, expected_grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", ["sdpa", "unfused"])
def test_fewer_queries_than_keys_are_the_last_rows(name, case):
    """As generation with a KV cache asks: 3 new queries over 10 keys."""
    query, key, value = inputs(queries=3)
    torch.testing.assert_close(TRAINING_KERNELS[name](query, key, value, AttentionSpec(**CASES[case])),
                               expected_of(case, query, key, value), rtol=1e-5, atol=1e-5)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_attention_block_masks_equal_attention_by_hand():
    """FlexAttention (GPU training's packed path) on the CPU, eager and forward-only as torch runs it there; the
    block mask is remade when the documents or the rule change."""
    flex = FlexAttention(compiled=False)
    query, key, value = inputs()
    for case in CASES:
        spec = AttentionSpec(**CASES[case])
        torch.testing.assert_close(flex(query, key, value, spec), expected_of(case, query, key, value),
                                   rtol=1e-5, atol=1e-5, msg=case)
    other_documents = AttentionSpec(segment_ids=SEGMENTS.flip(0))
    torch.testing.assert_close(flex(query, key, value, other_documents),
                               by_hand(query, key, value, segments=SEGMENTS.flip(0)), rtol=1e-5, atol=1e-5)


def test_the_spec_refuses_a_window_it_cannot_mean():
    with pytest.raises(InputError, match="^window_size -1: a sliding window is a causal model's count"):
        AttentionSpec(window_size=-1)
    with pytest.raises(InputError, match="^window_size 4: a sliding window"):
        AttentionSpec(causal=False, window_size=4)


def test_document_ends_count_over_the_rows_laid_end_to_end():
    assert AttentionSpec(segment_ids=SEGMENTS).document_ends() == [3, 7, 10, 18, 20]


def test_a_batch_spec_drops_dropout_outside_training():
    spec = AttentionSpec(window_size=3, dropout_p=0.1)
    assert spec.for_batch(SEGMENTS, training=False) == AttentionSpec(window_size=3, segment_ids=SEGMENTS)
    assert spec.for_batch(None, training=True) is not spec and spec.for_batch(None, training=True) == spec


@pytest.fixture(scope="module")
def packed_runs(tmp_path_factory):
    """Short documents each ended by the end-of-document id (NullTokenizer: VOCAB), several to a sample, trained
    as packed sequences (--reset-attention-mask, --reset-position-ids) by a Llama-style model with a window, on one
    process: the reference, and the flags."""
    prefix = str(tmp_path_factory.mktemp("packed") / "documents_text_document")
    rng = np.random.default_rng(1)
    with MMapIndexedDatasetBuilder(prefix, np.uint16) as builder:
        for _ in range(300):
            start, step, length = rng.integers(0, VOCAB), rng.integers(1, 4), rng.integers(3, 12)
            builder.add_item(np.append((start + step * np.arange(length)) % VOCAB, VOCAB))
            builder.end_document()
    flags = [*COMMON, "--data-path", prefix, "--reset-attention-mask", "--reset-position-ids", "--eod-mask-loss",
             "--window-size", "5,0", "--use-rotary-position-embeddings", "--no-position-embedding", "--swiglu",
             "--normalization", "rmsnorm", "--disable-bias-linear", "--num-key-value-heads", "2"]
    return flags, run_on_ranks(train, 1, [*flags, "--no-pipeline-parallel"])[0]


@pytest.mark.full  # multi-process / whole-run tests: the full tier
@pytest.mark.parametrize("layout", [["--tensor-model-parallel-size", "2", "--no-pipeline-parallel"],
                                    ["--ds-sequence-parallel-size", "2", "--no-pipeline-parallel"],
                                    ["--pipeline-model-parallel-size", "2"]], ids=["tp2", "ulysses-sp2", "pp2"])
def test_packed_documents_with_a_window_train_as_on_one_process(packed_runs, layout):
    """Segment ids stay whole under Ulysses while the tokens are cut; under PP they ride between stages with the
    position ids."""
    flags, reference = packed_runs
    assert_same_training(run_on_ranks(train, 2, [*flags, *layout])[0], reference)
