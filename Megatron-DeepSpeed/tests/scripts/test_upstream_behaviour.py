"""What upstream's extra flags do, piece by piece: the batch-size ramp, the token-based LR schedule, the cyclic
sampler, Megatron's unfused attention, the model switches, the extra log fields and the launcher's
--local_rank. (End-to-end runs of upstream's scripts are in test_upstream_scripts.py.)"""
import math

import pytest
import torch

from megatron import device
from megatron.config.batch_schedule import BatchSchedule
from megatron.config.learning_rates import learning_rate
from megatron.data.samplers import MegatronPretrainingRandomSampler
from megatron.errors import InputError
from megatron.model.attention_spec import AttentionSpec
from megatron.model.gpt import GPTConfig, GPTModel
from megatron.model.kernels import sdpa_attention
from megatron.model.unfused_attention import UnfusedAttention
from megatron.training.log_lines import iteration_line, parse_log

# --- --rampup-batch-size ---------------------------------------------------------------------------------


def test_rampup_grows_in_equal_sample_intervals_then_holds():
    # Upstream's example shape, shrunk: 16 -> 64 by 16 over 300 samples = 3 increments of 100 samples each.
    schedule = BatchSchedule(64, 8, (16, 16, 300))
    assert [schedule.batch_size(consumed) for consumed in (0, 99, 100, 199, 200, 299, 300, 301, 10 ** 6)] == \
        [16, 16, 32, 32, 48, 48, 64, 64, 64]
    assert schedule.micro_batches(150) == 4


def test_rampup_iterations_follow_upstreams_count():
    schedule = BatchSchedule(64, 8, (16, 16, 300))
    # Ramp: consumed 0,16,...,96 at 16 (7 steps to 112), 112..192 at 32 (3 steps to 208), 208,256 at 48 (to 304);
    # then (1000 - 304) // 64 = 10 full batches.
    consumed, sizes = 0, []
    while consumed <= 300:
        sizes.append(schedule.batch_size(consumed))
        consumed += sizes[-1]
    assert sizes == [16] * 7 + [32] * 3 + [48] * 2 and consumed == 304
    assert schedule.iterations(1000) == 12 + 10
    assert BatchSchedule(64, 8).iterations(1000) == 1000 // 64


# --- token-based learning rate ---------------------------------------------------------------------------

SCHEDULE = dict(max_lr=1.0, min_lr=0.1, warmup_samples=0, decay_samples=10 ** 6, decay_style="linear",
                tokens_per_sample=10)


def test_token_warmup_then_token_decay():
    lr = dict(SCHEDULE, warmup_tokens=100, decay_tokens=1100)
    assert learning_rate(5, **lr) == pytest.approx(0.5)  # 50 of 100 warmup tokens
    assert learning_rate(10, **lr) == pytest.approx(1.0)
    assert learning_rate(60, **lr) == pytest.approx(0.1 + 0.5 * 0.9)  # 600 tokens: half of the 1000-token decay
    assert learning_rate(111, **lr) == pytest.approx(0.1)


def test_sample_warmup_then_token_decay_starts_where_the_warmup_ended():
    # Upstream pins the decay's start to the tokens consumed when the sample warmup finished: 20 x 10.
    lr = dict(SCHEDULE, warmup_samples=20, decay_tokens=1200)
    assert learning_rate(10, **lr) == pytest.approx(0.5)
    assert learning_rate(70, **lr) == pytest.approx(0.1 + 0.5 * 0.9)  # 700 tokens: half of 200..1200


# --- --dataloader-type cyclic ----------------------------------------------------------------------------

def epoch_of(sampler_args):
    return list(MegatronPretrainingRandomSampler(*sampler_args))


def test_cyclic_sampler_shuffles_each_ranks_bucket_anew_every_epoch():
    total, mbs, dp = 50, 2, 2  # 48 samples per epoch (the incomplete last step is dropped), buckets of 24
    ranks = [MegatronPretrainingRandomSampler(total, 0, mbs, rank, dp) for rank in range(dp)]
    first = [sum(list(sampler), []) for sampler in ranks]
    assert sorted(first[0]) == list(range(24)) and sorted(first[1]) == list(range(24, 48))
    assert first[0] != list(range(24))  # shuffled
    second = [sum(list(sampler), []) for sampler in ranks]  # the same samplers again: the next epoch
    assert sorted(second[0]) == list(range(24)) and second[0] != first[0]
    assert ranks[0].consumed_samples == 96


def test_cyclic_sampler_resumes_mid_epoch_where_the_run_stopped():
    whole = epoch_of((50, 0, 2, 1, 2))
    assert epoch_of((50, 8, 2, 1, 2)) == whole[2:]  # 8 consumed = 2 steps of mbs 2 x dp 2
    next_epoch = epoch_of((50, 48, 2, 1, 2))
    assert epoch_of((50, 48 + 12, 2, 1, 2)) == next_epoch[3:]


def test_cyclic_sampler_rejects_a_dataset_smaller_than_one_step():
    with pytest.raises(InputError, match="fewer than one micro-batch step"):
        MegatronPretrainingRandomSampler(3, 0, 2, 0, 2)


# --- Megatron's unfused attention ------------------------------------------------------------------------

def qkv(dtype=torch.float32, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 3, 8, 16, generator=generator).mul(4).to(dtype) for _ in range(3)]


@pytest.mark.parametrize("scaling, fp32", [(False, False), (True, True)])
def test_unfused_attention_equals_the_fused_kernel_in_fp32(scaling, fp32):
    query, key, value = qkv()
    documents = AttentionSpec(segment_ids=torch.tensor([[0] * 5 + [1] * 3, [0] * 8]))  # --reset-attention-mask
    for spec in (AttentionSpec(), documents):
        unfused = UnfusedAttention(layer_number=7, apply_query_key_layer_scaling=scaling, softmax_in_fp32=fp32)
        torch.testing.assert_close(unfused(query, key, value, spec), sdpa_attention(query, key, value, spec))


def test_unfused_causal_mask_aligns_new_queries_with_the_last_keys():
    # As with a KV cache: the last 3 queries against all 8 keys give the last 3 rows of the full attention.
    query, key, value = qkv()
    unfused = UnfusedAttention(2, apply_query_key_layer_scaling=True, softmax_in_fp32=False)
    torch.testing.assert_close(unfused(query[:, :, -3:], key, value, AttentionSpec()),
                               unfused(query, key, value, AttentionSpec())[:, :, -3:])


@pytest.mark.low_precision
def test_query_key_layer_scaling_keeps_large_fp16_scores_finite():
    # q.k = 16 x 300 x 300 = 1.44e6: beyond fp16 (max 65504) even after 1/sqrt(16), within it after 1/(4 x 64).
    query = key = value = torch.full((1, 1, 4, 16), 300.0, dtype=torch.float16)
    scaled = UnfusedAttention(64, apply_query_key_layer_scaling=True, softmax_in_fp32=False)
    unscaled = UnfusedAttention(64, apply_query_key_layer_scaling=False, softmax_in_fp32=True)
    assert torch.isfinite(scaled(query, key, value, AttentionSpec())).all()
    assert not torch.isfinite(unscaled(query, key, value, AttentionSpec())).all()


@pytest.mark.parametrize("scaling, fp32, softmax_dtype", [(False, False, torch.bfloat16), (False, True, torch.float32),
                                                          (True, False, torch.float32)])
@pytest.mark.low_precision
def test_softmax_precision_under_bf16(scaling, fp32, softmax_dtype, monkeypatch):
    seen, softmax = [], torch.softmax
    monkeypatch.setattr(torch, "softmax", lambda scores, dim: seen.append(scores.dtype) or softmax(scores, dim))
    query, key, value = qkv(torch.bfloat16)
    output = UnfusedAttention(4, scaling, fp32)(query, key, value, AttentionSpec())
    assert seen == [softmax_dtype] and output.dtype == torch.bfloat16


# --- model switches --------------------------------------------------------------------------------------

SMALL = dict(vocab_size=64, max_position_embeddings=16, num_layers=4, hidden_size=16, num_attention_heads=2,
             hidden_dropout=0.0, attention_dropout=0.0)


def loss_and_grads(model, seed=3):
    tokens = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(seed))
    loss = model(tokens[:, :-1], labels=tokens[:, 1:])
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


def test_layernorm_epsilon_reaches_every_layer_norm():
    model = GPTModel(GPTConfig(**SMALL, layernorm_epsilon=1e-3))
    norms = [module for module in model.modules() if isinstance(module, torch.nn.LayerNorm)]
    assert len(norms) == 2 * 4 + 1 and {norm.eps for norm in norms} == {1e-3}


def test_xavier_uniform_initialisation_of_weight_matrices():
    model = GPTModel(GPTConfig(**SMALL, init_method_xavier_uniform=True))
    for name, weight in model.named_parameters():
        if weight.dim() == 2:
            bound = math.sqrt(6.0 / sum(weight.shape))
            assert weight.abs().max() <= bound and weight.abs().max() > 0.9 * bound, name
    normal = GPTModel(GPTConfig(**SMALL))
    assert normal.embedding.word_embeddings.weight.std().item() == pytest.approx(0.02, rel=0.1)


@pytest.mark.parametrize("chunk", [1, 3])
def test_checkpoint_num_layers_recomputes_chunks_with_the_same_gradients(chunk):
    reference = loss_and_grads(GPTModel(GPTConfig(**SMALL)))
    checkpointed = GPTModel(GPTConfig(**SMALL, checkpoint_activations=True, checkpoint_num_layers=chunk))
    calls = []
    recompute = checkpointed.checkpoint_layer
    checkpointed.checkpoint_layer = lambda function, *args: calls.append(1) or recompute(function, *args)
    loss, grads = loss_and_grads(checkpointed)
    assert len(calls) == math.ceil(4 / chunk)
    torch.testing.assert_close(loss, reference[0])
    for name, grad in grads.items():
        torch.testing.assert_close(grad, reference[1][name], msg=name)


@pytest.mark.low_precision
def test_fp32_residual_connection_keeps_the_stream_fp32_under_bf16():
    model = GPTModel(GPTConfig(**SMALL, fp32_residual_connection=True)).to(torch.bfloat16)
    seen = []
    for layer in model.layers:
        layer.register_forward_hook(lambda module, inputs, output: seen.append((inputs[0].dtype, output.dtype)))
    tokens = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    logits = model(tokens)
    assert seen == [(torch.float32, torch.float32)] * 4
    assert logits.dtype == torch.bfloat16
    plain = GPTModel(GPTConfig(**SMALL)).to(torch.bfloat16)
    exact = GPTModel(GPTConfig(**SMALL))(tokens).double()
    assert (logits.double() - exact).abs().mean() < (plain(tokens).double() - exact).abs().mean()


# --- log fields and the launcher contract ----------------------------------------------------------------

def test_log_line_carries_num_zeros_and_params_norm_where_upstream_puts_them():
    line = iteration_line(3, 10, 24, 5.0, 1e-3, 8, 2.5, 1.0, 0.75, 0, 0, 9.0, 0.1, num_zeros=12.0,
                          params_norm=31.25)
    assert " grad norm: 0.750 | num zeros: 12.0 | params norm: 31.250 | number of skipped iterations:" in line
    (record,) = parse_log(line).iterations
    assert (record.num_zeros, record.params_norm, record.grad_norm) == (12.0, 31.25, 0.75)
    assert "num zeros" not in iteration_line(3, 10, 24, 5.0, 1e-3, 8, 2.5, 1.0, 0.75, 0, 0, 9.0, 0.1)


def test_local_rank_flag_sets_or_must_match_the_environment(monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    device.use_local_rank_flag(None)
    assert device.local_rank() == 0
    device.use_local_rank_flag(1)
    assert device.local_rank() == 1
    device.use_local_rank_flag(1)
    with pytest.raises(InputError, match="--local_rank 0 contradicts environment variable LOCAL_RANK=1"):
        device.use_local_rank_flag(0)


def test_unfused_path_is_selected_by_no_masked_softmax_fusion():
    fused = GPTModel(GPTConfig(**SMALL))
    unfused = GPTModel(GPTConfig(**SMALL, masked_softmax_fusion=False))
    assert isinstance(unfused.layers[2].self_attention.attend, UnfusedAttention)
    assert unfused.layers[2].self_attention.attend.coefficient == 3.0  # layer numbers count from 1
    assert not isinstance(fused.layers[0].self_attention.attend, UnfusedAttention)
    tokens = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(unfused(tokens), fused(tokens))
