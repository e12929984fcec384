"""Llama-style decoders (docs/llama.md): the model equals transformers' LlamaForCausalLM on the same weights,
rotary embeddings rotate only their share of each head, the parameter count of the Llama presets is the Llama
formula in the built model and in the planner, the FLOPs count the built layer's matrices, and upstream's flags
reach the model or are refused in one line. Every parallel layout trains as one process does
(test_llama_layouts_equal_single_process)."""
import os

import pytest
import torch

from megatron.checkpoint.reshape.conversions import reshape
from megatron.checkpoint.reshape.target_writer import TargetLayout
from megatron.config.arguments import job_config, parse_args, validate_args
from megatron.config.model_config import ModelConfig
from megatron.config.presets import get_preset
from megatron.errors import InputError
from megatron.inference.generation import generate_batch
from megatron.inference.sampling import SamplingParams, prompt_generators
from megatron.model.gpt import GPTConfig, GPTModel
from megatron.model.gpt_config import gpt_config
from megatron.model.rotary import RotaryEmbedding
from megatron.planning.shape import shape_from_preset, stage_parameters
from megatron.training.flops import LayerMatrices
from tests.helpers.distributed import run_on_ranks
from tests.helpers.training import COMMON, assert_same_training, train

# Upstream's Llama switches (examples_deepspeed/pretrain_llama2_distributed.sh) at test sizes: 4 query heads in 2
# groups, SwiGLU branches of 48; Llama 3.1's rotary scaling from an original context of 8, so every layout also
# computes the scaled frequencies as one process does.
LLAMA_FLAGS = ["--normalization", "rmsnorm", "--use-rotary-position-embeddings", "--swiglu", "--ffn-hidden-size", "48",
               "--num-key-value-heads", "2", "--disable-bias-linear", "--untie-embeddings-and-output-weights",
               "--no-query-key-layer-scaling", "--use-rope-scaling", "--rope-scaling-factor", "4",
               "--rope-scaling-original-max-position-embeddings", "8"]
VOCAB = 64


def llama_config(**overrides) -> GPTConfig:
    return GPTConfig(**{**dict(
        vocab_size=VOCAB, max_position_embeddings=16, num_layers=2, hidden_size=32, num_attention_heads=4,
        num_key_value_heads=2, ffn_hidden_size=48, hidden_dropout=0.0, attention_dropout=0.0, init_method_std=0.3,
        normalization="rmsnorm", add_position_embedding=False, use_rotary_position_embeddings=True, swiglu=True,
        add_bias_linear=False, untie_embeddings_and_output_weights=True, rope_theta=500000), **overrides})


def hf_weights(model: GPTModel) -> dict:
    """`model`'s weights under LlamaForCausalLM's names: the grouped QKV rows [groups, (queries, key, value),
    head_dim] and the [gate; up] halves (upstream Megatron-DeepSpeed's TP-1 rows) cut into transformers' separate
    projections."""
    config = model.config
    groups, head_dim, hidden = config.num_key_value_heads, config.head_dim, config.hidden_size
    weights = {"model.embed_tokens.weight": model.embedding.word_embeddings.weight,
               "model.norm.weight": model.final_layernorm.weight, "lm_head.weight": model.lm_head.weight}
    for index, layer in enumerate(model.layers):
        ours, theirs = layer, f"model.layers.{index}."
        qkv = ours.self_attention.query_key_value.weight.view(groups, -1, head_dim, hidden)
        gate_up = ours.mlp.dense_h_to_4h.weight.view(2, config.ffn_hidden_size, hidden)
        weights.update({
            theirs + "self_attn.q_proj.weight": qkv[:, :-2].reshape(-1, hidden),
            theirs + "self_attn.k_proj.weight": qkv[:, -2].reshape(-1, hidden),
            theirs + "self_attn.v_proj.weight": qkv[:, -1].reshape(-1, hidden),
            theirs + "self_attn.o_proj.weight": ours.self_attention.dense.weight,
            theirs + "mlp.gate_proj.weight": gate_up[0], theirs + "mlp.up_proj.weight": gate_up[1],
            theirs + "mlp.down_proj.weight": ours.mlp.dense_4h_to_h.weight,
            theirs + "input_layernorm.weight": ours.input_layernorm.weight,
            theirs + "post_attention_layernorm.weight": ours.post_attention_layernorm.weight})
    return weights


def hf_llama(model: GPTModel, sliding_window=None):
    """transformers' LlamaForCausalLM on `model`'s weights; with a sliding window, its MistralForCausalLM (the same
    parameters)."""
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM
    config = model.config
    kind, options = (LlamaForCausalLM, LlamaConfig) if sliding_window is None else (
        MistralForCausalLM, lambda **kw: MistralConfig(sliding_window=sliding_window, **kw))
    hf = kind(options(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size, intermediate_size=config.ffn_hidden_size,
        num_hidden_layers=config.num_layers, num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads, max_position_embeddings=config.max_position_embeddings,
        rms_norm_eps=config.layernorm_epsilon, rope_theta=config.rope_theta, tie_word_embeddings=False,
        attn_implementation="eager", **({"attention_bias": False, "mlp_bias": False} if sliding_window is None
                                        else {})))
    weights = hf_weights(model)
    with torch.no_grad():
        for name, parameter in hf.named_parameters():
            parameter.copy_(weights.pop(name))
    assert not weights
    return hf.eval()


def assert_generates_as_transformers(model, hf, prompts):
    """Greedy generation with and without the KV cache gives transformers' `generate` tokens for each prompt."""
    ours = {cache: generate_batch(model, prompts, 6, SamplingParams(), prompt_generators(1, range(2)), None, VOCAB,
                                  use_kv_cache=cache) for cache in (True, False)}
    assert ours[True] == ours[False]
    for prompt, generated in zip(prompts, ours[True]):
        expected = hf.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False, pad_token_id=0)
        assert generated == expected[0, len(prompt):].tolist()


@pytest.mark.parametrize("kv_heads, fused", [(2, True), (1, True), (4, True), (2, False)],
                         ids=["gqa", "mqa", "mha", "gqa-unfused-attention"])
def test_llama_equals_transformers_and_generates_the_same_with_the_kv_cache(kv_heads, fused):
    model = GPTModel(llama_config(num_key_value_heads=kv_heads, masked_softmax_fusion=fused)).eval()
    hf = hf_llama(model)
    tokens = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), hf(tokens).logits, rtol=1e-5, atol=1e-5)
    prompts = [[5, 9, 2, 7, 1], [3, 8]]  # left-padded: rotary angles depend on distances only
    assert_generates_as_transformers(model, hf, prompts)


def test_a_sliding_window_equals_transformers_mistral_and_generates_the_same_past_the_window():
    """Hugging Face's sliding_window 4 is window_size 3 (model/attention_spec.py); prompts longer than the window
    generate through the KV cache as transformers' generate does."""
    model = GPTModel(llama_config(window_size=3)).eval()
    hf = hf_llama(model, sliding_window=4)
    tokens = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), hf(tokens).logits, rtol=1e-5, atol=1e-5)
        assert not torch.allclose(GPTModel(llama_config()).eval()(tokens)[:, 4:], model(tokens)[:, 4:])
    prompts = [[5, 9, 2, 7, 1, 4, 6, 3], [3, 8]]
    assert_generates_as_transformers(model, hf, prompts)


@pytest.mark.low_precision
def test_bf16_with_an_fp32_residual_stream_follows_fp32():
    """RMSNorm on the fp32 stream normalises in fp32 with the bf16 weight upcast (model/gpt.py's normalize)."""
    reference = GPTModel(llama_config(init_method_std=0.02))
    half = GPTModel(llama_config(init_method_std=0.02, fp32_residual_connection=True)).to(torch.bfloat16)
    tokens = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))
    hidden = half.embedding(tokens)
    assert hidden.dtype == torch.float32 and half.layers[0](hidden).dtype == torch.float32
    with torch.no_grad():
        torch.testing.assert_close(half(tokens).float(), reference(tokens), rtol=0.05, atol=0.05)


def test_rotary_percent_rotates_the_first_channels_and_keeps_distances():
    rotary = RotaryEmbedding.for_heads(head_dim=8, percent=0.5, theta=10000)
    heads = torch.randn(1, 2, 5, 8, generator=torch.Generator().manual_seed(0))
    rotated = rotary(heads, torch.arange(5)[None])
    assert torch.equal(rotated[..., 4:], heads[..., 4:]) and not torch.allclose(rotated[..., :4], heads[..., :4])
    # channel i pairs with i + dim/2: a complex number turned by position x theta^(-2i/dim)
    pairs = torch.complex(heads[..., :2], heads[..., 2:4])
    angles = torch.arange(5.0)[:, None] * 10000.0 ** (-torch.arange(0, 4, 2) / 4)
    turned = pairs * torch.polar(torch.ones_like(angles), angles)
    torch.testing.assert_close(rotated[..., :4], torch.cat((turned.real, turned.imag), dim=-1))
    shifted = rotary(heads, torch.arange(7, 12)[None])
    scores = rotated @ rotated.transpose(-1, -2)
    torch.testing.assert_close(shifted @ shifted.transpose(-1, -2), scores)  # q.k depends on distance only
    with pytest.raises(InputError, match=r"^--rotary-percent 0.1 of the head size 8 is 0 channels"):
        RotaryEmbedding.for_heads(8, 0.1, 10000)


LLAMA_PARAMETERS = {("llama2-7B", 32000): 6_738_415_616, ("llama3-8B", 128256): 8_030_261_248,
                    ("tinyllama-1.1B", 32000): 1_100_048_384, ("llama2-13B", 32000): 13_015_864_320,
                    ("llama3.1-8B", 128256): 8_030_261_248, ("llama3.2-1B", 128256): 1_235_814_400,
                    ("llama3.2-3B", 128256): 3_212_749_824}


@pytest.mark.parametrize("name, vocab", list(LLAMA_PARAMETERS))
def test_preset_parameter_count_is_the_llama_formula_in_the_built_model_and_the_planner(name, vocab):
    preset = get_preset(name)
    model = ModelConfig.from_flags({**preset, "max_position_embeddings": preset["seq_length"]})
    h, f, kv, layers = model.hidden_size, model.ffn_hidden_size, model.num_key_value_heads, model.num_layers
    head_dim = h // model.num_attention_heads
    # two RMSNorms, Q and O (h x h each), K and V (h x kv heads x head_dim each), three SwiGLU matrices; the word
    # embedding and the output layer unless tied (Llama 3.2); the final RMSNorm. No biases, no position table.
    heads_out = 1 + model.untie_embeddings_and_output_weights
    formula = layers * (2 * h + 2 * h * h + 2 * h * kv * head_dim + 3 * h * f) + heads_out * vocab * h + h
    assert formula == LLAMA_PARAMETERS[name, vocab]  # the published sizes
    with torch.device("meta"):
        built = GPTModel(gpt_config(model, padded_vocab_size=vocab))
    assert sum(parameter.numel() for parameter in built.parameters()) == formula
    shape, _ = shape_from_preset(name, vocab_size=vocab)
    assert stage_parameters(shape, 1, 1, 0, pipeline_engine=False) == formula
    assert stage_parameters(shape, 1, 1, 0) == formula  # the pipeline engine at PP 1: the head is not a copy
    layer = LayerMatrices.of(model)  # what the FLOPs count multiplies with: the built layer's matrices
    assert layer.attention + layer.mlp == sum(p.numel() for p in built.layers[0].parameters() if p.dim() == 2)


@pytest.mark.parametrize("name, factor, tied", [("llama3.1-8B", 8.0, False), ("llama3.2-1B", 32.0, True),
                                               ("llama3.2-3B", 32.0, True), ("llama3.1-tiny", 4.0, False)])
def test_llama_3_1_and_3_2_presets_build_their_rotary_scaling_and_head(name, factor, tied):
    model = job_config(validate_args(parse_args(["--model-size", name, "--mock-data", "--tokenizer-type",
                                                 "NullTokenizer", "--vocab-size", "100"]), 8, "cuda")).model
    scaling = (model.rope_scaling_type, model.rope_scaling_factor, model.rope_scaling_original_max_position_embeddings,
               model.rope_scaling_low_freq_factor, model.rope_scaling_high_freq_factor)
    assert scaling == ("llama3", factor, 8192, 1.0, 4.0)
    assert model.untie_embeddings_and_output_weights is not tied


UPSTREAM_LLAMA2 = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
                   "--micro-batch-size", "1", "--global-batch-size", "4", "--train-iters", "1", "--mock-data",
                   "--tokenizer-type", "NullTokenizer", "--vocab-size", "60", "--lr", "3e-4",
                   "--attention-dropout", "0", "--hidden-dropout", "0", *LLAMA_FLAGS]


def job(*flags, world=4):
    return job_config(validate_args(parse_args([*UPSTREAM_LLAMA2, *flags]), world, "cpu"))


def test_upstream_flags_reach_the_model_and_bad_combinations_get_one_line():
    model = job("--tensor-model-parallel-size", "2", "--rotary-base", "500000").model
    assert (model.normalization, model.swiglu, model.num_key_value_heads, model.add_bias_linear, model.rope_theta,
            model.untie_embeddings_and_output_weights, model.use_rotary_position_embeddings,
            model.add_position_embedding, model.ffn_hidden_size) == (
        "rmsnorm", True, 2, False, 500000, True, True, False, 48)
    assert (model.rope_scaling_type, model.rope_scaling_factor, model.rope_scaling_original_max_position_embeddings) \
        == ("llama3", 4.0, 8)
    assert job("--rotary-position-embeddings-theta", "1000").model.rope_theta == 1000
    assert job(world=1).model.rope_theta == 10000 and not job(world=1).model.apply_query_key_layer_scaling
    with pytest.raises(InputError, match=r"^--num-key-value-heads 2 is not divisible by --tensor-model-parallel-size "
                                         r"4; each tensor-parallel rank holds whole query groups"):
        job("--tensor-model-parallel-size", "4")
    with pytest.raises(InputError, match=r"^--num-attention-heads 4 is not divisible by --num-key-value-heads 3"):
        job("--num-key-value-heads", "3", world=1)
    with pytest.raises(InputError, match=r"^--rotary-percent 1.5 must be in \(0, 1\]"):
        job("--rotary-percent", "1.5", world=1)
    with pytest.raises(InputError, match=r"^argument --normalization: invalid choice: 'batchnorm'"):
        job("--normalization", "batchnorm", world=1)


# --- every layout equals one process (real processes over gloo, fp32) ----------------------------------------

@pytest.fixture(scope="module")
def llama_single_process(data_prefix):
    return run_on_ranks(train, 1, [*COMMON, *LLAMA_FLAGS, "--data-path", data_prefix])[0]


THREE_D = ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2", "--sequence-parallel",
           "--zero-stage", "1", "--checkpoint-activations"]
SAVED_AT = 3


def llama_run(ranks, data_prefix, *flags):
    return run_on_ranks(train, ranks, [*COMMON, *LLAMA_FLAGS, "--data-path", data_prefix, *flags], timeout=600)[0]


@pytest.fixture(scope="module")
def llama_3d(data_prefix, tmp_path_factory):
    """TP2 x PP2 x DP2 with SP, ZeRO 1 and recomputation (8 processes), saving at iteration 3."""
    save = tmp_path_factory.mktemp("llama_3d")
    return llama_run(8, data_prefix, *THREE_D, "--save", str(save), "--save-interval", str(SAVED_AT)), str(save)


@pytest.mark.full
def test_llama_layouts_equal_single_process(data_prefix, llama_single_process, llama_3d):
    names = llama_single_process[1].keys()
    assert "lm_head.weight" in names and not any("position_embeddings" in name or "bias" in name for name in names)
    assert_same_training(llama_3d[0], llama_single_process)
    plain_tp2 = ["--tensor-model-parallel-size", "2", "--sequence-parallel", "--no-pipeline-parallel",
                 "--zero-stage", "0"]
    assert_same_training(llama_run(2, data_prefix, *plain_tp2), llama_single_process)


@pytest.mark.full
def test_llama_3d_checkpoint_resumes_exactly_and_reshaped_continues_on_one_process(data_prefix, llama_3d, tmp_path):
    (straight_losses, straight_weights), save = llama_3d
    with open(os.path.join(save, "latest"), "w") as latest:
        latest.write(f"global_step{SAVED_AT}")
    resumed_losses, resumed_weights = llama_run(8, data_prefix, *THREE_D, "--load", save)
    assert resumed_losses == straight_losses[SAVED_AT:]
    for name, tensor in resumed_weights.items():
        torch.testing.assert_close(tensor, straight_weights[name], rtol=0, atol=0, msg=name)
    # Grouped QKV rows, per-rank [gate_r; up_r] rows, the untied head's vocabulary rows and their Adam state joined
    # from TP 2 x PP 2 into one process.
    copy = str(tmp_path / "tp1pp1")
    reshape(save, copy, TargetLayout(1, 1), iteration=SAVED_AT)
    continued, _ = llama_run(1, data_prefix, "--load", copy, "--zero-stage", "0")
    assert continued == pytest.approx(straight_losses[SAVED_AT:], rel=1e-5)
