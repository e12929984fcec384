"""DeepSpeed-Ulysses sequence parallelism (model/ulysses.py) on real gloo processes equals single-process training
(fp32, dropout 0): GPT-2 at SP 2 (ZeRO 1) and SP 2 x DP 2 (ZeRO 0), a Llama-style model (rotary positions, grouped-query attention)
with Qwen3's per-head query/key norms at SP 2; a checkpoint resumes at the same SP size exactly and loads at another (SP holds whole weights)."""
import pytest
import torch

from megatron.config.arguments import parse_args, validate_args
from megatron.errors import InputError
from tests.helpers.distributed import run_on_ranks
from tests.helpers.training import COMMON, ITERATIONS, TINY_FLAGS, assert_same_training, train

ULYSSES = ["--ds-sequence-parallel-size", "2", "--no-pipeline-parallel"]
LLAMA = ["--use-rotary-position-embeddings", "--no-position-embedding", "--swiglu", "--normalization", "rmsnorm",
         "--disable-bias-linear", "--untie-embeddings-and-output-weights", "--num-key-value-heads", "2",
         "--rope-scaling-type", "yarn", "--rope-scaling-factor", "4", "--yarn-original-max-position-embeddings", "8",
         "--qk-layernorm", "--kv-channels", "16"]


@pytest.mark.full  # multi-process / whole-run tests: the full tier
def test_sp2_dp2_equals_single_process(data_prefix, single_process):
    result = run_on_ranks(train, 4, [*COMMON, "--data-path", data_prefix, *ULYSSES, "--zero-stage", "0"])[0]
    assert_same_training(result, single_process)


@pytest.mark.full
def test_llama_with_qk_norms_under_ulysses_equals_single_process(data_prefix):
    """Rotary angles (YaRN-scaled) must follow each chunk's global positions, and each rank must hold whole
    key/value heads. The query/key norms (heads of 16 channels at hidden 32) run before the all-to-all, on this
    rank's tokens and every head, so their gradients are each rank's tokens' share, summed by DeepSpeed over the
    sequence-parallel ranks as every other weight's."""
    flags = [*COMMON, "--data-path", data_prefix, *LLAMA, "--no-pipeline-parallel"]
    reference = run_on_ranks(train, 1, flags)[0]
    norms = [name for name in reference[1] if name.endswith(("q_norm.weight", "k_norm.weight"))]
    assert len(norms) == 4 and all(tuple(reference[1][name].shape) == (16,) for name in norms)
    assert_same_training(run_on_ranks(train, 2, [*flags, "--ds-sequence-parallel-size", "2"])[0], reference)


@pytest.mark.full
def test_sp2_equals_single_process_and_its_checkpoint_loads_at_any_sequence_parallel_size(
        data_prefix, single_process, tmp_path):
    flags = [*COMMON, "--data-path", data_prefix, "--no-pipeline-parallel", "--zero-stage", "1"]
    straight = run_on_ranks(train, 2, [*flags, "--ds-sequence-parallel-size", "2", "--save", str(tmp_path),
                                       "--save-interval", "3"])[0]
    assert_same_training(straight, single_process)
    (tmp_path / "latest").write_text("global_step3")
    resumed = run_on_ranks(train, 2, [*flags, "--ds-sequence-parallel-size", "2", "--load", str(tmp_path)])[0]
    assert resumed[0] == straight[0][3:]
    for name, tensor in resumed[1].items():
        torch.testing.assert_close(tensor, straight[1][name], rtol=0, atol=0, msg=name)
    # The same files at SP 1 x DP 2: ZeRO kept its partitions over the same two ranks, and the weights are whole.
    elsewhere = run_on_ranks(train, 2, [*flags, "--load", str(tmp_path)])[0]
    assert len(elsewhere[0]) == ITERATIONS - 3
    assert elsewhere[0] == pytest.approx(straight[0][3:], rel=1e-5)
    for name, tensor in elsewhere[1].items():
        torch.testing.assert_close(tensor, straight[1][name], rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("flags, world_size, message", [
    (["--ds-sequence-parallel-size", "3"], 6, "--num-attention-heads 4 is not divisible by --ds-sequence-parallel-size 3"),
    (["--ds-sequence-parallel-size", "2", "--num-key-value-heads", "1"], 2,
     "--num-key-value-heads 1 is not divisible by --ds-sequence-parallel-size 2"),
    (["--ds-sequence-parallel-size", "4", "--seq-length", "30", "--max-position-embeddings", "32"], 4,
     "--seq-length 30 is not divisible by --ds-sequence-parallel-size 4"),
    (["--ds-sequence-parallel-size", "2", "--tensor-model-parallel-size", "2"], 4,
     "DeepSpeed-Ulysses runs with tensor and pipeline parallel size 1"),
    (["--ds_sequence_parallel_size", "2"], 2, "runs on DeepSpeed's plain engine, as upstream's sequence-parallel "
                                              "scripts do; add --no-pipeline-parallel"),
    (["--ds-sequence-parallel-size", "2"], 3, "world size 3 is not divisible by --tensor-model-parallel-size 1 x "
     "--pipeline-model-parallel-size 1 x --ds-sequence-parallel-size 2 = 2"),
    (["--ds-sequence-parallel-size", "2", "--num-experts", "2"], 2, "mixture-of-experts layers are not built"),
])
def test_layouts_ulysses_cannot_run_are_refused_in_one_line(flags, world_size, message):
    base = [*TINY_FLAGS, "--micro-batch-size", "1", "--train-iters", "4", "--mock-data"]
    plain = [] if "--ds_sequence_parallel_size" in flags else ["--no-pipeline-parallel"]
    with pytest.raises(InputError) as caught:
        validate_args(parse_args([*base, *plain, *flags]), world_size, "cpu")
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_data_parallel_size_leaves_out_the_sequence_parallel_ranks():
    base = [*TINY_FLAGS, "--micro-batch-size", "1", "--train-iters", "4", "--mock-data", "--no-pipeline-parallel"]
    values = validate_args(parse_args([*base, "--ds-sequence-parallel-size", "2"]), 8, "cpu")
    assert (values.data_parallel_size, values.global_batch_size) == (4, 4)


def test_grouped_key_value_heads_are_repeated_after_the_all_to_all_not_before():
    """Under Ulysses a layer's grouped-query key/value cross the all-to-all with their own heads (UlyssesAttention's
    takes_grouped_kv where they divide among the ranks); the local core then pairs each query head with its group's
    key/value head, as the model's repeat would have, for a kernel that needs them repeated."""
    from megatron.model.attention_spec import AttentionSpec
    from megatron.model.kernels import sdpa_attention
    from megatron.model.ulysses import _LocalCore
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(2, 6, 4, 8, generator=generator)  # [batch, seq, heads, head_dim], as DeepSpeed calls it
    key, value = (torch.randn(2, 6, 2, 8, generator=generator) for _ in range(2))
    context = _LocalCore(sdpa_attention)(query, key, value, AttentionSpec())
    repeated = [t.repeat_interleave(2, dim=2).transpose(1, 2) for t in (key, value)]
    torch.testing.assert_close(context, sdpa_attention(query.transpose(1, 2), *repeated, AttentionSpec()).transpose(1, 2))
