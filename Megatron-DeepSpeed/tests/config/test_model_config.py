"""The one model-config mapping: a model with every flag off its default keeps all of them from the command line
to the built modules, through a written checkpoint, a Hugging Face export and its import, and the model that
generation loads; old checkpoints get upstream's defaults; resuming refuses a different architecture; and a
training run with --layernorm-epsilon 0.01 exports and generates with 0.01."""
import json
from dataclasses import fields, replace

import pytest
import torch
from tests.helpers.distributed import run_on_ranks
from tests.helpers.training import COMMON, VOCAB, train, write_counting_dataset

from megatron.hf import files as hf_files
from megatron.hf.directory import model_config_from_hf
from megatron.families import hf_tensors
from megatron.families.gpt2 import hf_adapter as hf_gpt2
from megatron.hf.conversions import export_hf, import_hf
from megatron.checkpoint.reshape.conversions import reshape
from megatron.checkpoint.formats.reader import read_checkpoint
from megatron.checkpoint.trainer.resume_plan import check_model_flags
from megatron.checkpoint.reshape.target_writer import TargetLayout, TrainingState, write_checkpoint
from megatron.config.arguments import job_config, parse_args, validate_args
from megatron.config.model_config import ARCHITECTURE_FLAGS, VARIANT_FLAGS, ModelConfig
from megatron.families.rope_scaling import ROPE_SCALING_FLAGS
from megatron.errors import InputError
from megatron.inference.loading import load_model
from megatron.model.gpt import GPTModel
from megatron.model.gpt_config import gpt_config, model_config_of
from megatron.model.kernels import PORTABLE_KERNELS
from megatron.model.provider import model_provider
from megatron.families.rope_scaling import RopeScaling
from megatron.model.unfused_attention import UnfusedAttention
from megatron.tensor_parallel import tensor_parallel_rng_tracker

TOKENS, PADDED = VOCAB + 1, 256  # NullTokenizer --vocab-size VOCAB (eod = VOCAB), padded by 64
EVERY_FLAG_CHANGED = ModelConfig(
    num_layers=3, hidden_size=48, num_attention_heads=6, max_position_embeddings=40, ffn_hidden_size=80,
    openai_gelu=True, layernorm_epsilon=0.01, hidden_dropout=0.2, attention_dropout=0.3, init_method_std=0.05,
    init_method_xavier_uniform=True, seed=99, checkpoint_activations=True, checkpoint_num_layers=2,
    recompute_granularity="selective", recompute_num_layers=2,
    fp32_residual_connection=True, masked_softmax_fusion=False, apply_query_key_layer_scaling=False,
    attention_softmax_in_fp32=True, torch_compile=True)
# The architecture variants (a Llama-style model), which transformers' GPT-2 cannot hold: every one off GPT-2's.
EVERY_VARIANT_CHANGED = ModelConfig(
    num_layers=2, hidden_size=32, num_attention_heads=4, max_position_embeddings=40, ffn_hidden_size=48,
    normalization="rmsnorm", add_position_embedding=False, use_rotary_position_embeddings=True, rotary_percent=0.5,
    rope_theta=500000, window_size=7, swiglu=True, num_key_value_heads=2, add_bias_linear=False,
    untie_embeddings_and_output_weights=True, add_qkv_bias=True, rope_scaling_type="yarn", rope_scaling_factor=4.0,
    rope_scaling_low_freq_factor=2.0, rope_scaling_high_freq_factor=8.0,
    rope_scaling_original_max_position_embeddings=10,
    yarn_beta_fast=16.0, yarn_beta_slow=2.0, yarn_mscale=0.9, yarn_mscale_all_dim=0.5, yarn_attention_factor=1.2,
    yarn_correction_range_round_to_int=False, kv_channels=16, qk_layernorm=True)
VARIANT_COMMAND_LINE = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "40",
                        "--ffn-hidden-size", "48", "--normalization", "rmsnorm", "--use-rotary-position-embeddings",
                        "--rotary-percent", "0.5", "--rotary-base", "500000", "--window-size", "7,0", "--swiglu",
                        "--num-key-value-heads", "2",
                        "--disable-bias-linear", "--untie-embeddings-and-output-weights", "--add-qkv-bias",
                        "--rope-scaling-type",
                        "yarn", "--rope-scaling-factor", "4", "--rope-scaling-low-freq-factor", "2",
                        "--rope-scaling-high-freq-factor", "8", "--yarn-original-max-position-embeddings", "10",
                        "--yarn-beta-fast", "16", "--yarn-beta-slow", "2", "--mscale", "0.9", "--mscale-all-dim", "0.5",
                        "--yarn-attention-factor", "1.2", "--no-yarn-correction-range-round-to-int",
                        "--kv-channels", "16", "--qk-layernorm"]
COMMAND_LINE = ["--num-layers", "3", "--hidden-size", "48", "--num-attention-heads", "6", "--seq-length", "40",
                "--ffn-hidden-size", "80", "--openai-gelu", "--layernorm-epsilon", "0.01", "--hidden-dropout", "0.2",
                "--attention-dropout", "0.3", "--init-method-std", "0.05", "--init-method-xavier-uniform",
                "--seed", "99", "--checkpoint-activations", "--checkpoint-num-layers", "2",
                "--recompute-granularity", "selective", "--recompute-num-layers", "2",
                "--fp32-residual-connection", "--bf16", "--no-masked-softmax-fusion", "--no-query-key-layer-scaling",
                "--attention-softmax-in-fp32", "--torch-compile"]
RUN = ["--micro-batch-size", "2", "--global-batch-size", "2", "--lr", "1e-3", "--train-iters", "2", "--mock-data",
       "--tokenizer-type", "NullTokenizer", "--vocab-size", str(VOCAB), "--make-vocab-size-divisible-by", "64"]


# Flags that cannot be off their default together with the others: --recompute-method needs --recompute-granularity
# full, which excludes --checkpoint-activations (tests/model/test_recompute_granularity.py covers it).
AT_DEFAULT_HERE = {"recompute_method"}


def test_every_model_flag_is_off_its_default_here():
    """So that a flag added to ModelConfig without a place in these tests fails them."""
    for spec in fields(ModelConfig):
        changed = EVERY_VARIANT_CHANGED if spec.name in VARIANT_FLAGS else EVERY_FLAG_CHANGED
        assert (getattr(changed, spec.name) != spec.default) != (spec.name in AT_DEFAULT_HERE), spec.name
    for config in (EVERY_FLAG_CHANGED, EVERY_VARIANT_CHANGED):
        assert ModelConfig.from_flags(config.to_flags()) == config


@pytest.mark.parametrize("command_line, expected", [(COMMAND_LINE, EVERY_FLAG_CHANGED),
                                                    (VARIANT_COMMAND_LINE, EVERY_VARIANT_CHANGED)])
def test_the_command_line_gives_the_model_config_and_records_its_flags(command_line, expected):
    config = job_config(validate_args(parse_args([*command_line, *RUN, "--no-pipeline-parallel"]), 1, "cpu"))
    assert config.model == expected
    assert {flag: config.flags[flag] for flag in expected.to_flags()} == expected.to_flags()


def test_old_checkpoints_get_upstream_defaults_and_bad_values_a_clear_error():
    shape = dict(num_layers=2, hidden_size=32, num_attention_heads=4, max_position_embeddings=16)
    old = ModelConfig.from_flags({**shape, "checkpoint_activations": None})
    assert (old.layernorm_epsilon, old.hidden_dropout, old.ffn_hidden_size, old.seed, old.masked_softmax_fusion,
            old.checkpoint_activations) == (1e-5, 0.1, 128, 1234, True, False)
    with pytest.raises(InputError, match=r"^--hidden-size is missing from the flags recorded in X; "):
        ModelConfig.from_flags({**shape, "hidden_size": None}, "the flags recorded in X")
    with pytest.raises(InputError, match=r"^--layernorm-epsilon is 'big' in the command line; it must be float"):
        ModelConfig.from_flags({**shape, "layernorm_epsilon": "big"})
    with pytest.raises(InputError, match=r"--num-layers is 2.5 in the command line; it must be int"):
        ModelConfig.from_flags({**shape, "num_layers": 2.5})
    assert (old.rope_scaling_type, old.rope_scaling_factor) == (None, None)  # unscaled, as before the flags
    with pytest.raises(InputError, match=r"^--rope-scaling-type 'ntk' is not one of llama3, linear, yarn$"):
        ModelConfig.from_flags({**shape, "rope_scaling_type": "ntk"}, "the flags recorded in X")


def test_resuming_refuses_a_run_that_changes_any_architecture_flag():
    recorded = EVERY_FLAG_CHANGED.to_flags()
    check_model_flags("ckpt", recorded, recorded)
    assert set(ARCHITECTURE_FLAGS) == {"num_layers", "hidden_size", "num_attention_heads", "max_position_embeddings",
                                       "ffn_hidden_size", "openai_gelu", "layernorm_epsilon", "normalization",
                                       "add_position_embedding", "use_rotary_position_embeddings", "rotary_percent",
                                       "rope_theta", "window_size", "swiglu", "num_key_value_heads", "add_bias_linear",
                                       "untie_embeddings_and_output_weights", "add_qkv_bias", "kv_channels",
                                       "qk_layernorm", *ROPE_SCALING_FLAGS}
    for flag in ARCHITECTURE_FLAGS:
        with pytest.raises(InputError, match=f"--{flag.replace('_', '-')} 7 \\(checkpoint: "):
            check_model_flags("ckpt", recorded, {**recorded, flag: 7})
    check_model_flags("ckpt", recorded, {**recorded, "hidden_dropout": 0.0, "seed": 1})  # training choices


def assert_built_as(model: GPTModel, expected: ModelConfig, dropout: tuple):
    """The modules of `model` carry `expected`'s architecture and numerics, and (hidden, attention) `dropout`."""
    norms = [module for module in model.modules() if isinstance(module, torch.nn.LayerNorm)]
    assert len(norms) == 2 * expected.num_layers + 1
    assert {norm.eps for norm in norms} == {expected.layernorm_epsilon}
    assert model.embedding.position_embeddings.weight.shape == (expected.max_position_embeddings,
                                                                 expected.hidden_size)
    assert model.embedding.fp32_residual_connection is expected.fp32_residual_connection
    for index, layer in enumerate(model.layers):
        assert layer.mlp.dense_h_to_4h.out_features == expected.ffn_hidden_size
        assert layer.mlp.gelu_approximation == ("tanh" if expected.openai_gelu else "none")
        attention = layer.self_attention
        assert attention.num_heads == expected.num_attention_heads
        assert isinstance(attention.attend, UnfusedAttention) is not expected.masked_softmax_fusion
        assert attention.attend.coefficient == (index + 1 if expected.apply_query_key_layer_scaling else None)
        assert attention.attend.softmax_in_fp32 is expected.attention_softmax_in_fp32
        assert (layer.dropout.p, attention.spec.dropout_p) == dropout
    assert model.embedding.dropout.p == dropout[0]


def provided_model(model: ModelConfig):
    """The model the trainer builds (plain engine, TP 1) for `model`."""
    job = job_config(validate_args(parse_args([*COMMAND_LINE, *RUN, "--no-pipeline-parallel"]), 1, "cpu"))
    return model_provider(gpt_config(model, PADDED, PORTABLE_KERNELS), job.parallel, None,
                          tensor_parallel_rng_tracker(model.seed, 0))


def test_every_flag_reaches_the_trained_modules():
    config = gpt_config(EVERY_FLAG_CHANGED, PADDED, PORTABLE_KERNELS)
    assert model_config_of(config) == EVERY_FLAG_CHANGED and config.init_seed == 99  # no field dropped
    model = provided_model(replace(EVERY_FLAG_CHANGED, torch_compile=False))  # compiling: the test below
    assert_built_as(model, EVERY_FLAG_CHANGED, dropout=(0.2, 0.3))
    again = GPTModel(config)  # the seed decides the weights, Xavier-uniform ones
    assert torch.equal(again.layers[0].mlp.dense_h_to_4h.weight, model.layers[0].mlp.dense_h_to_4h.weight)
    bound = (6 / (48 + 80)) ** 0.5
    assert 0.9 * bound < model.layers[0].mlp.dense_h_to_4h.weight.abs().max() <= bound


@pytest.mark.full  # torch.compile's first use imports dynamo: about 6 s
def test_torch_compile_reaches_the_trained_modules():
    model = provided_model(EVERY_FLAG_CHANGED)
    assert model._compiled_call_impl is not None  # the whole model (tests/model/test_torch_compile.py)


def written_checkpoint(directory: str, model: ModelConfig, unrecorded=()) -> str:
    """A real checkpoint (the files pretrain_gpt.py --load reads) of a freshly built `model`, its flags
    `unrecorded` left out as by a version that did not have them."""
    weights = GPTModel(gpt_config(model, PADDED)).state_dict()
    args = {**model.to_flags(), "tokenizer_type": "NullTokenizer", "tokenizer_vocab_size": TOKENS,
            "make_vocab_size_divisible_by": 64}
    args = {flag: value for flag, value in args.items() if flag not in unrecorded}
    write_checkpoint(directory, weights, gpt_config(model, PADDED), TrainingState(0, 0, args), TargetLayout(1, 1))
    return directory


def test_every_flag_survives_save_read_hf_export_import_and_reaches_the_generation_model(tmp_path):
    saved = written_checkpoint(str(tmp_path / "ckpt"), EVERY_FLAG_CHANGED)
    assert read_checkpoint(saved).model_config == EVERY_FLAG_CHANGED
    export_hf(saved, str(tmp_path / "hf"))
    config_json = json.loads((tmp_path / "hf" / hf_files.CONFIG_FILE).read_text())
    assert (config_json["layer_norm_epsilon"], config_json["activation_function"], config_json["n_positions"],
            config_json["n_inner"], config_json["resid_pdrop"], config_json["attn_pdrop"]) == \
           (0.01, "gelu_new", 40, 80, 0.2, 0.3)
    from transformers import GPT2Config
    assert GPT2Config.from_pretrained(str(tmp_path / "hf")).layer_norm_epsilon == 0.01
    import_hf(str(tmp_path / "hf"), str(tmp_path / "imported"), TargetLayout(1, 1), make_vocab_size_divisible_by=64)
    imported = read_checkpoint(str(tmp_path / "imported"))
    assert imported.model_config == EVERY_FLAG_CHANGED
    model, _ = load_model(str(tmp_path / "imported"), tokenizer_vocab_size=TOKENS, parallel_state=None,
                          kernels=PORTABLE_KERNELS, dtype=torch.float32, device=torch.device("cpu"))
    assert_built_as(model, EVERY_FLAG_CHANGED, dropout=(0.0, 0.0))


def test_every_variant_survives_save_read_and_reaches_the_generation_model_but_not_hf_export(tmp_path):
    saved = written_checkpoint(str(tmp_path / "ckpt"), EVERY_VARIANT_CHANGED)
    assert read_checkpoint(saved).model_config == EVERY_VARIANT_CHANGED
    model, _ = load_model(saved, tokenizer_vocab_size=TOKENS, parallel_state=None, kernels=PORTABLE_KERNELS,
                          dtype=torch.float32, device=torch.device("cpu"))
    expected = GPTModel(gpt_config(EVERY_VARIANT_CHANGED, PADDED))
    assert model.state_dict().keys() == expected.state_dict().keys()
    for name, tensor in expected.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name
    attention = model.layers[0].self_attention
    assert (attention.rotary.dim, attention.rotary.theta, attention.num_groups) == (8, 500000.0, 2)
    assert attention.q_norm.weight.shape == attention.k_norm.weight.shape == (16,)
    assert attention.rotary.scaling == RopeScaling("yarn", 4.0, 10, 2.0, 8.0, 16.0, 2.0, 0.9, 0.5, 1.2, False)
    assert attention.spec.window_size == 7
    assert isinstance(model.final_layernorm, torch.nn.RMSNorm) and model.layers[0].mlp.swiglu
    with pytest.raises(InputError, match=r"^--to-hf: .* holds a model with --normalization rmsnorm, "
                                         r"--add-position-embedding False, .*, which none of transformers' .*LlamaForCausalLM"
                                         r".* can hold \(.*Llama needs .*--rotary-percent 1"):
        export_hf(saved, str(tmp_path / "hf"))


def test_a_reshaped_old_checkpoint_records_every_model_flag(tmp_path):
    model = ModelConfig(num_layers=2, hidden_size=32, num_attention_heads=4, max_position_embeddings=16)
    old = written_checkpoint(str(tmp_path / "old"), model, unrecorded=("layernorm_epsilon", "masked_softmax_fusion"))
    assert "layernorm_epsilon" not in read_checkpoint(old).args
    reshape(old, str(tmp_path / "new"), TargetLayout(2, 1))
    recorded = read_checkpoint(str(tmp_path / "new")).args
    assert (recorded["layernorm_epsilon"], recorded["masked_softmax_fusion"]) == (1e-5, True)


def test_a_plain_gpt2_config_json_is_the_upstream_default_model():
    config = model_config_from_hf(hf_gpt2, {"n_layer": 2, "n_embd": 32, "n_head": 4, "n_positions": 16}, "config.json")
    assert config == ModelConfig(num_layers=2, hidden_size=32, num_attention_heads=4, max_position_embeddings=16,
                                 openai_gelu=True)  # transformers' default activation is the tanh form
    with pytest.raises(InputError, match=r"^config.json sets megatron_model_flags to 3; it must map flag names"):
        model_config_from_hf(hf_gpt2, {"n_layer": 2, hf_tensors.MODEL_FLAGS_KEY: 3}, "config.json")


@pytest.mark.full  # a training run
def test_a_run_trained_with_layernorm_epsilon_exports_and_generates_with_it(tmp_path):
    data = write_counting_dataset(str(tmp_path / "counting_text_document"), documents=60)
    save = str(tmp_path / "checkpoint")
    _, weights = run_on_ranks(train, 1, [*COMMON, "--data-path", data, "--layernorm-epsilon", "0.01", "--save", save,
                                         "--save-interval", "5"])[0]
    assert read_checkpoint(save).model_config.layernorm_epsilon == 0.01
    export_hf(save, str(tmp_path / "hf"))
    assert json.loads((tmp_path / "hf" / hf_files.CONFIG_FILE).read_text())["layer_norm_epsilon"] == 0.01
    model, _ = load_model(save, tokenizer_vocab_size=TOKENS, parallel_state=None, kernels=PORTABLE_KERNELS,
                          dtype=torch.float32, device=torch.device("cpu"))
    assert {module.eps for module in model.modules() if isinstance(module, torch.nn.LayerNorm)} == {0.01}
    assert torch.equal(model.final_layernorm.weight, weights["final_layernorm.weight"])
