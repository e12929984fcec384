"""The GPT model against HF GPT-2 (the numerics oracle), its initialisation, masking, checkpointing, dropout,
and the kernels passed into it."""
import math
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from megatron.families.gpt2.hf_adapter import to_hf_tensors
from megatron.errors import InputError
from megatron.model import gpt, kernels
from megatron.model.attention_spec import AttentionSpec
from megatron.model.gpt import GPTConfig, GPTModel

SMALL = dict(vocab_size=96, max_position_embeddings=16, num_layers=2, hidden_size=32, num_attention_heads=4,
             ffn_hidden_size=48, hidden_dropout=0.0, attention_dropout=0.0)


def small_model(seed=0, **overrides):
    torch.manual_seed(seed)
    return GPTModel(GPTConfig(**{**SMALL, **overrides}))


def random_tokens(vocab_size, batch=2, seq=12, seed=1):
    return torch.randint(0, vocab_size, (batch, seq), generator=torch.Generator().manual_seed(seed))


# --- HF GPT-2 parity ---------------------------------------------------------------------------------

def hf_twin(model, hf_vocab_size, activation, attn_implementation):
    from transformers import GPT2Config, GPT2LMHeadModel
    config = model.config
    hf_config = GPT2Config(vocab_size=hf_vocab_size, n_positions=config.max_position_embeddings,
                           n_embd=config.hidden_size, n_layer=config.num_layers, n_head=config.num_attention_heads,
                           n_inner=config.ffn_hidden_size, activation_function=activation,
                           layer_norm_epsilon=config.layernorm_epsilon, resid_pdrop=0.0, embd_pdrop=0.0,
                           attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    hf_model = GPT2LMHeadModel._from_config(hf_config, attn_implementation=attn_implementation)
    weights = dict(to_hf_tensors(model.state_dict(), config, hf_vocab_size))
    with torch.no_grad():
        for name, parameter in hf_model.named_parameters():
            parameter.copy_(weights.pop(name))
    assert not weights, f"converted tensors HF has no parameter for: {sorted(weights)}"
    return hf_model.eval()


@pytest.mark.parametrize("openai_gelu, activation, attn_implementation",
                         [(False, "gelu", "eager"), (True, "gelu_new", "sdpa")])
def test_same_logits_and_loss_as_hf_gpt2(openai_gelu, activation, attn_implementation):
    model = small_model(openai_gelu=openai_gelu).eval()
    hf_model = hf_twin(model, SMALL["vocab_size"], activation, attn_implementation)
    tokens = random_tokens(SMALL["vocab_size"], seq=13)
    with torch.no_grad():
        logits = model(tokens)
        hf_output = hf_model(input_ids=tokens, labels=tokens)
        loss = model(tokens[:, :-1], labels=tokens[:, 1:])  # HF shifts the labels itself
    assert (logits - hf_output.logits).abs().max() < 1e-5
    assert abs(loss.item() - hf_output.loss.item()) < 1e-5


def test_padded_vocab_matches_hf_on_the_real_vocab():
    model = small_model(vocab_size=128).eval()
    hf_model = hf_twin(model, 100, "gelu", "eager")
    tokens = random_tokens(100)
    with torch.no_grad():
        logits = model(tokens)
        hf_logits = hf_model(input_ids=tokens).logits
    assert logits.shape[-1] == 128
    assert (logits[..., :100] - hf_logits).abs().max() < 1e-5


# --- initialisation ----------------------------------------------------------------------------------

def test_initialisation_statistics_and_tied_head():
    model = small_model(hidden_size=256, num_attention_heads=4, ffn_hidden_size=None, num_layers=4,
                        vocab_size=512, max_position_embeddings=64)
    params = dict(model.named_parameters())
    output_std = 0.02 / math.sqrt(2 * 4)
    for name, parameter in params.items():
        if name.endswith("bias"):
            assert torch.count_nonzero(parameter) == 0, name
        elif "layernorm" in name:
            assert torch.all(parameter == 1.0), name
        else:
            expected = output_std if name.endswith(("self_attention.dense.weight", "dense_4h_to_h.weight")) else 0.02
            assert parameter.std().item() == pytest.approx(expected, rel=0.03), name
            assert abs(parameter.mean().item()) < expected / 20, name
    assert params["layers.0.mlp.dense_h_to_4h.weight"].shape == (1024, 256)  # default ffn = 4h
    # Tied head: the only [vocab, hidden] matrix is the word embedding, and it is what the head uses.
    assert [n for n, p in params.items() if p.shape == (512, 256)] == ["embedding.word_embeddings.weight"]
    tokens = torch.arange(10).unsqueeze(0)  # token 500 never appears in the input...
    model(tokens, labels=torch.arange(1, 11).unsqueeze(0)).backward()
    assert model.embedding.word_embeddings.weight.grad[500].abs().sum() > 0  # ...yet its row learns via the head


def test_same_seed_same_weights():
    first, second = small_model(seed=7), small_model(seed=7)
    for (name, a), b in zip(first.state_dict().items(), second.state_dict().values()):
        assert torch.equal(a, b), name


# --- loss --------------------------------------------------------------------------------------------

@pytest.mark.low_precision
def test_loss_by_hand():
    # position 0: logits (0, 0), label 0 -> ln 2;  position 1: logits (ln 3, 0), label 1 -> ln 4
    logits = torch.tensor([[[0.0, 0.0], [math.log(3.0), 0.0]]])
    labels = torch.tensor([[0, 1]])
    assert gpt.LanguageModelLoss()(logits, labels).item() == pytest.approx(1.5 * math.log(2.0))
    assert gpt.LanguageModelLoss()(logits, labels, torch.tensor([[1, 0]])).item() == pytest.approx(math.log(2.0))
    assert gpt.LanguageModelLoss()(logits, labels, torch.tensor([[0, 1]])).item() == pytest.approx(math.log(4.0))
    bf16_loss = gpt.LanguageModelLoss()(logits.bfloat16(), labels)
    assert bf16_loss.dtype == torch.float32


def test_loss_mask_ignores_masked_positions():
    model = small_model().eval()
    tokens, labels = random_tokens(96, seed=2), random_tokens(96, seed=3)
    loss_mask = torch.ones_like(labels)
    loss_mask[:, 5:] = 0
    with torch.no_grad():
        token_losses = torch.nn.functional.cross_entropy(model(tokens).transpose(1, 2), labels, reduction="none")
        masked = model(tokens, labels=labels, loss_mask=loss_mask)
        other_labels = labels.clone()
        other_labels[:, 5:] = (labels[:, 5:] + 1) % 96
        assert torch.equal(model(tokens, labels=other_labels, loss_mask=loss_mask), masked)
        assert torch.allclose(masked, token_losses[:, :5].mean())
        assert torch.allclose(model(tokens, labels=labels), token_losses.mean())


# --- attention masking -------------------------------------------------------------------------------

def test_causal_future_tokens_do_not_change_earlier_logits():
    model = small_model().eval()
    tokens = random_tokens(96)
    changed = tokens.clone()
    changed[:, 7] = (tokens[:, 7] + 1) % 96
    with torch.no_grad():
        before, after = model(tokens), model(changed)
    assert torch.equal(before[:, :7], after[:, :7])
    assert not torch.allclose(before[:, 7:], after[:, 7:])


def causal_mask(batch, seq):
    """Megatron convention: True where a query may NOT look (the future)."""
    return torch.triu(torch.ones(seq, seq, dtype=torch.bool), diagonal=1).expand(batch, 1, seq, seq)


def test_one_segment_equals_one_stream():
    model = small_model().eval()
    tokens = random_tokens(96)
    with torch.no_grad():
        assert torch.allclose(model(tokens, segment_ids=torch.zeros(2, 12, dtype=torch.long)), model(tokens),
                              atol=1e-6)


ROTARY = dict(use_rotary_position_embeddings=True, add_position_embedding=False, normalization="rmsnorm")


@pytest.mark.parametrize("variant", [{}, ROTARY], ids=["learned-positions", "rotary"])
def test_reset_attention_mask_isolates_documents(variant):
    """Two documents packed in one sample, with Megatron's --reset-attention-mask/--reset-position-ids:
    each document's logits equal those of running it alone (rotary embeddings turn by the restarting positions)."""
    model = small_model(**variant).eval()
    first_doc, second_doc = random_tokens(96, batch=1, seq=5, seed=4), random_tokens(96, batch=1, seq=7, seed=5)
    packed = torch.cat([first_doc, second_doc], dim=1)
    segment_ids = torch.tensor([[0] * 5 + [1] * 7])
    position_ids = torch.cat([torch.arange(5), torch.arange(7)]).unsqueeze(0)
    with torch.no_grad():
        packed_logits = model(packed, position_ids=position_ids, segment_ids=segment_ids)
        torch.testing.assert_close(packed_logits[:, 5:], model(second_doc), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(packed_logits[:, :5], model(first_doc), rtol=1e-5, atol=1e-5)


MISTRAL_LIKE = dict(ROTARY, window_size=2, swiglu=True, num_key_value_heads=2)


@pytest.mark.parametrize("variant", [{}, ROTARY, MISTRAL_LIKE], ids=["gpt2", "rotary", "rotary-window"])
def test_a_packed_batch_gives_each_example_its_loss_and_gradients_alone(variant):
    """Three examples packed into one row (segment ids, restarting positions): the loss over one example's tokens
    and its gradients equal training that example alone (fp32, 1e-5)."""
    lengths = (4, 6, 5)
    examples = [random_tokens(96, batch=1, seq=length + 1, seed=10 + index) for index, length in enumerate(lengths)]
    packed = dict(tokens=torch.cat([e[:, :-1] for e in examples], 1), labels=torch.cat([e[:, 1:] for e in examples], 1),
                  segment_ids=torch.cat([torch.full((1, n), i) for i, n in enumerate(lengths)], 1),
                  position_ids=torch.cat([torch.arange(n) for n in lengths])[None])
    ends = torch.tensor(lengths).cumsum(0).tolist()
    for index, example in enumerate(examples):
        model = small_model(**variant)
        alone = model(example[:, :-1], labels=example[:, 1:])
        expected = torch.autograd.grad(alone, list(model.parameters()))
        loss_mask = torch.zeros(1, sum(lengths))
        loss_mask[:, ends[index] - lengths[index]:ends[index]] = 1
        loss = model(packed["tokens"], labels=packed["labels"], loss_mask=loss_mask,
                     position_ids=packed["position_ids"], segment_ids=packed["segment_ids"])
        torch.testing.assert_close(loss, alone, rtol=1e-5, atol=1e-6)
        gradients = torch.autograd.grad(loss, list(model.parameters()))
        for (name, _), grad, expected_grad in zip(model.named_parameters(), gradients, expected):
            torch.testing.assert_close(grad, expected_grad, rtol=1e-5, atol=1e-6, msg=name)


# --- activation checkpointing and dropout ------------------------------------------------------------

def loss_and_grads(model, tokens, seed):
    torch.manual_seed(seed)
    loss = model(tokens[:, :-1], labels=tokens[:, 1:])
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


def test_activation_checkpointing_same_loss_and_grads_and_recomputes():
    dropout = dict(hidden_dropout=0.1, attention_dropout=0.1)
    plain = small_model(**dropout).train()
    checkpointed = small_model(**dropout, checkpoint_activations=True).train()
    calls = []
    checkpointed.layers[0].mlp.register_forward_hook(lambda *_: calls.append(1))
    tokens = random_tokens(96, seq=13)
    plain_loss, plain_grads = loss_and_grads(plain, tokens, seed=11)
    ckpt_loss, ckpt_grads = loss_and_grads(checkpointed, tokens, seed=11)
    assert len(calls) == 2  # forward once, then again during backward: the layer really was checkpointed
    assert torch.equal(plain_loss, ckpt_loss)
    for name, grad in plain_grads.items():
        assert torch.equal(grad, ckpt_grads[name]), name


def test_dropout_active_in_training_only():
    model = small_model(hidden_dropout=0.2, attention_dropout=0.2)
    no_dropout = small_model(hidden_dropout=0.0, attention_dropout=0.0)  # same seed: same weights
    tokens = random_tokens(96)
    with torch.no_grad():
        model.train()
        assert not torch.allclose(model(tokens), model(tokens))
        model.eval()
        assert torch.equal(model(tokens), model(tokens))
        assert torch.equal(model(tokens), no_dropout.eval()(tokens))


# --- user errors -------------------------------------------------------------------------------------

def test_heads_must_divide_hidden_size():
    with pytest.raises(InputError, match="--hidden-size 30 is not divisible by --num-attention-heads 4"):
        GPTConfig(**{**SMALL, "hidden_size": 30})


def test_dropout_out_of_range():
    with pytest.raises(InputError, match="--hidden-dropout is 1.5"):
        GPTConfig(**{**SMALL, "hidden_dropout": 1.5})


def test_sequence_longer_than_position_table():
    with pytest.raises(InputError, match="sequence length 17 exceeds --max-position-embeddings 16"):
        small_model()(random_tokens(96, seq=17))


# --- kernel selection --------------------------------------------------------------------------------

def test_kernel_defaults_and_adaptor_overrides():
    assert kernels.select_kernels("npu") == kernels.PORTABLE_KERNELS  # no torch_npu here: no fused kernel for it
    assert kernels.select_kernels("cpu").adam is kernels.FUSED_ADAMW  # the dispatcher has the CPU kernel
    adaptor = SimpleNamespace(attention=None, layer_norm=torch.nn.RMSNorm, adam=torch.optim.SGD)
    chosen = kernels.select_kernels("npu", adaptor)
    assert chosen.layer_norm is torch.nn.RMSNorm
    assert chosen.attention is kernels.sdpa_attention
    assert chosen.adam is kernels.FOREACH_ADAMW  # the Adam rule is the trainer's alone
    assert chosen.description() == "attention sdpa_attention, AdamW(foreach=True)"


def test_fused_adamw_follows_the_dispatcher():
    assert kernels.fused_adamw_available("cpu")
    assert not kernels.fused_adamw_available("npu")  # torch does not know the device type without torch_npu
    assert not kernels.fused_adamw_available("meta")  # a known device type without the kernel


def test_an_adaptor_training_attention_is_not_used_for_inference():
    def training_attention(query, key, value, spec):
        raise AssertionError("documented for training only")
    adaptor = SimpleNamespace(attention=training_attention)
    assert kernels.select_kernels("npu", adaptor).attention is training_attention
    assert kernels.select_kernels("npu", adaptor, training=False).attention is kernels.sdpa_attention


def test_attention_kernel_passed_in_is_used_by_the_model():
    calls = []

    def counting_attention(query, key, value, spec):
        calls.append(query.shape)
        return kernels.sdpa_attention(query, key, value, spec)

    small_model(kernels=replace(kernels.PORTABLE_KERNELS, attention=counting_attention))(random_tokens(96))
    assert calls == [(2, 4, 12, 8)] * 2  # [batch, heads, seq, head_dim], once per layer


class GroupedKVKernel:
    """SDPA taking grouped K/V as they come (its enable_gqa pairs query head h with K/V head h // Q), recording
    the K/V heads it is handed."""
    takes_grouped_kv = True

    def __init__(self):
        self.key_heads = []

    def __call__(self, query, key, value, spec):
        self.key_heads.append(key.shape[1])
        return torch.nn.functional.scaled_dot_product_attention(query, key, value, is_causal=True, enable_gqa=True)


@pytest.mark.parametrize("tensor_parallel_wrapper", [False, True])
def test_a_kernel_that_takes_grouped_kv_gets_them_unrepeated_and_the_same_logits(tensor_parallel_wrapper):
    """Also through the tensor-parallel plan's RNGForkedAttention, which must not hide the kernel's answer."""
    from megatron.model.parallelize import RNGForkedAttention
    from megatron.tensor_parallel import tensor_parallel_rng_tracker

    grouped = GroupedKVKernel()
    model = small_model(num_key_value_heads=2, kernels=replace(kernels.PORTABLE_KERNELS, attention=grouped))
    if tensor_parallel_wrapper:
        for layer in model.layers:
            layer.self_attention.attend = RNGForkedAttention(layer.self_attention.attend,
                                                             tensor_parallel_rng_tracker(3, 0))
    tokens = random_tokens(96)
    torch.testing.assert_close(model(tokens), small_model(num_key_value_heads=2)(tokens))
    assert grouped.key_heads == [2, 2]


def test_sdpa_attention_matches_softmax_by_hand():
    generator = torch.Generator().manual_seed(3)
    query, key, value = (torch.randn(1, 2, 4, 8, generator=generator) for _ in range(3))
    mask = torch.tensor([[0, 1, 1, 1], [0, 0, 1, 1], [1, 0, 0, 1], [1, 1, 0, 0]], dtype=torch.bool)
    scores = (query @ key.transpose(-1, -2)) / math.sqrt(8)
    expected = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ value
    got = kernels.sdpa_attention(query, key, value, AttentionSpec(window_size=1))  # itself and the key before
    assert torch.allclose(got, expected, atol=1e-6)
    causal = kernels.sdpa_attention(query, key, value, AttentionSpec())
    expected_causal = torch.softmax(scores.masked_fill(causal_mask(1, 4), float("-inf")), dim=-1) @ value
    assert torch.allclose(causal, expected_causal, atol=1e-6)


def test_a_seeds_embedding_is_drawn_as_earlier_versions_drew_it():
    """Both tables are built (torch's own initialisation draws) before either is initialised, so a seed's
    initial weights, and the runs and checkpoints made from them, stay those of earlier versions."""
    config = GPTConfig(vocab_size=8, max_position_embeddings=4, num_layers=1, hidden_size=4, num_attention_heads=1)
    with gpt.seeded_init(config, gpt.EMBEDDING_PIECE):
        built = gpt.Embedding(config)
    with gpt.seeded_init(config, gpt.EMBEDDING_PIECE):
        tables = torch.nn.Embedding(8, 4), torch.nn.Embedding(4, 4)
        for table in tables:
            torch.nn.init.normal_(table.weight, std=config.init_method_std)
    assert torch.equal(built.word_embeddings.weight, tables[0].weight)
    assert torch.equal(built.position_embeddings.weight, tables[1].weight)
