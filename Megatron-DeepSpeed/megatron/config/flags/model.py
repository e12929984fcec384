"""Model flags: the shape (--num-layers ... or a --model-size preset), numerics, initialisation and upstream's
kernel switches; their checks, and the ModelConfig section."""
from typing import Mapping, Optional, Union

from megatron.config.flags.common import Limits, after_preset, flag
from megatron.config.model_config import DEFAULTS, ROPE_SCALING_DEFAULTS, SWITCHES, ModelConfig
from megatron.config.presets import preset_names
from megatron.errors import InputError, require_divisible

LIMITS = Limits(required=("num_layers", "hidden_size", "num_attention_heads", "seq_length"),
                positive=("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "seq_length",
                          "max_position_embeddings", "make_vocab_size_divisible_by", "num_key_value_heads",
                          "kv_channels",
                          "rope_theta", "rope_scaling_factor", "rope_scaling_low_freq_factor",
                          "rope_scaling_high_freq_factor", "rope_scaling_original_max_position_embeddings",
                          "yarn_beta_fast", "yarn_beta_slow", "yarn_attention_factor"),
                non_negative=("init_method_std",),
                fractions=("hidden_dropout", "attention_dropout"))
ROPE_SCALING_TYPES = tuple(ROPE_SCALING_DEFAULTS)
# Defaults of the flags a --model-size preset may fill, when neither it nor the user set them: ModelConfig's.
PRESET_DEFAULTS = {name: DEFAULTS[name] for name in (
    "hidden_dropout", "attention_dropout", "normalization", "use_rotary_position_embeddings", "rope_theta",
    "add_position_embedding", "swiglu", "add_bias_linear", "untie_embeddings_and_output_weights", *SWITCHES)}


def add_flags(parser) -> None:
    group = parser.add_argument_group("model")
    group.add_argument("--model-size", choices=preset_names(), default=None,
                       help="Fill every model/batch/LR/parallel flag not given explicitly from "
                            "this preset (megatron/config/presets.py).")
    group.add_argument("--num-layers", type=int, help="Number of transformer layers.")
    group.add_argument("--hidden-size", type=int, help="Transformer hidden size.")
    group.add_argument("--num-attention-heads", type=int, help="Attention heads per layer.")
    group.add_argument("--seq-length", type=int, help="Tokens per sample.")
    group.add_argument("--ffn-hidden-size", type=int,
                       help="MLP inner size. Default 4 x --hidden-size.")
    group.add_argument("--max-position-embeddings", type=int,
                       help="Size of the position embedding table. Default --seq-length.")
    group.add_argument("--make-vocab-size-divisible-by", type=int, default=128,
                       help="Pad the vocab to a multiple of this x tensor parallel size.")
    group.add_argument("--init-method-std", type=float, default=0.02,
                       help="Std of the normal weight init.")
    group.add_argument("--hidden-dropout", type=float,
                       help="Dropout after attention and MLP. " + after_preset(PRESET_DEFAULTS["hidden_dropout"]))
    group.add_argument("--attention-dropout", type=float,
                       help="Dropout on attention probabilities. "
                            + after_preset(PRESET_DEFAULTS["attention_dropout"]))
    group.add_argument("--openai-gelu", action="store_true",
                       help="Use the tanh approximation of GeLU instead of the erf form.")
    _add_numerics_flags(parser)
    _add_architecture_variants(parser)
    _add_rope_scaling_flags(parser)
    _add_kernel_switches(parser)


def _add_architecture_variants(parser) -> None:
    group = parser.add_argument_group(
        "architecture variants", "Upstream Megatron-DeepSpeed main's switches from GPT-2 towards Llama "
        "(docs/llama.md); the defaults are GPT-2's.")
    group.add_argument("--normalization", choices=("layernorm", "rmsnorm"),
                       help="The norm before attention, before the MLP and at the end: LayerNorm (weight and "
                            "bias) or RMSNorm (weight only). --layernorm-epsilon is its epsilon either way. "
                            + after_preset(PRESET_DEFAULTS["normalization"]))
    group.add_argument("--use-rotary-position-embeddings", action="store_true", default=None,
                       help="Rotary position embeddings on queries and keys (and, as upstream, no learned "
                            "absolute position table).")
    group.add_argument("--rotary-percent", type=float, default=1.0,
                       help="Fraction of each head's channels that rotate (upstream: 1.0; GPT-NeoX 0.25).")
    group.add_argument("--rotary-position-embeddings-theta", "--rotary-base", type=int, dest="rope_theta",
                       help="The rotary base theta (Llama 2: 10000, Llama 3: 500000). "
                            + after_preset(PRESET_DEFAULTS["rope_theta"]))
    group.add_argument("--window-size", type=str, default=None, metavar="LEFT,RIGHT",
                       help="Sliding-window attention, as Megatron-LM spells it: each query sees itself and the "
                            "LEFT keys before it (Hugging Face's sliding_window W is LEFT = W - 1); RIGHT must be 0 "
                            "(a causal model sees no later key); LEFT -1 or no flag: no window. LEFT alone is "
                            "accepted.")
    group.add_argument("--no-position-embedding", action="store_false", default=None, dest="add_position_embedding",
                       help="No learned absolute position table.")
    group.add_argument("--swiglu", action="store_true", default=None,
                       help="SiLU-gated MLP (SwiGLU): two input branches of --ffn-hidden-size each, one output "
                            "projection.")
    group.add_argument("--num-key-value-heads", type=int,
                       help="Key/value heads (grouped-query attention; 1: multi-query). Default "
                            "--num-attention-heads.")
    group.add_argument("--kv-channels", type=int,
                       help="Each attention head's size (Qwen3: 128 at any hidden size). Default --hidden-size / "
                            "--num-attention-heads.")
    group.add_argument("--disable-bias-linear", action="store_false", default=None, dest="add_bias_linear",
                       help="No biases in the attention and MLP linears (norms keep theirs).")
    group.add_argument("--untie-embeddings-and-output-weights", action="store_true", default=None,
                       help="An output layer of its own instead of scoring against the word embeddings.")
    for name, text in SWITCHES.items():
        group.add_argument(flag(name), action="store_true", default=None, help=text)


def _add_rope_scaling_flags(parser) -> None:
    group = parser.add_argument_group(
        "rotary scaling", "Longer contexts from rotary frequencies trained on a shorter one, as transformers' "
        "rope_parameters define them (docs/llama.md). Megatron-LM's flags; --rope-scaling-type where it has none. "
        "The parameters of a type other than the chosen one have no effect.")
    group.add_argument("--rope-scaling-type", choices=ROPE_SCALING_TYPES,
                       help="llama3: Llama 3.1's rule (factor, low/high frequency factors, original context); "
                            "linear: every frequency divided by the factor (position interpolation); yarn: YaRN "
                            "(factor, beta fast/slow, mscale, original context). Needs "
                            "--use-rotary-position-embeddings. Default: unscaled.")
    group.add_argument("--use-rope-scaling", action="store_const", const="llama3", dest="rope_scaling_type",
                       help="Megatron-LM's switch for Llama 3.x's rule: --rope-scaling-type llama3.")
    group.add_argument("--rope-scaling-factor", "--rotary-scaling-factor", type=float,
                       help="How many times longer the context becomes. Default 8 for llama3 (Megatron-LM's); "
                            "linear and yarn need it.")
    group.add_argument("--rotary-seq-len-interpolation-factor", type=int,
                       help="Megatron-LM's position interpolation: --rope-scaling-type linear with this factor.")
    group.add_argument("--rope-scaling-low-freq-factor", type=float,
                       default=DEFAULTS["rope_scaling_low_freq_factor"],
                       help="llama3: wavelengths above original context / this are divided by the factor.")
    group.add_argument("--rope-scaling-high-freq-factor", type=float,
                       default=DEFAULTS["rope_scaling_high_freq_factor"],
                       help="llama3: wavelengths below original context / this are kept; those between blend.")
    group.add_argument("--yarn-original-max-position-embeddings", "--rope-scaling-original-max-position-embeddings",
                       type=int, dest="rope_scaling_original_max_position_embeddings",
                       help="The context the rotary frequencies were trained on (llama3 and yarn). Default 8192 "
                            "for llama3, 4096 for yarn (Megatron-LM's).")
    group.add_argument("--yarn-beta-fast", type=float, default=DEFAULTS["yarn_beta_fast"],
                       help="yarn: channels turning more often than this within the original context keep their "
                            "frequency.")
    group.add_argument("--yarn-beta-slow", type=float, default=DEFAULTS["yarn_beta_slow"],
                       help="yarn: channels turning less often than this are divided by the factor; those between "
                            "blend.")
    group.add_argument("--yarn-mscale", "--mscale", type=float, default=DEFAULTS["yarn_mscale"], dest="yarn_mscale",
                       help="yarn: the attention factor is (0.1 mscale ln(factor) + 1) / (0.1 mscale-all-dim "
                            "ln(factor) + 1).")
    group.add_argument("--yarn-mscale-all-dim", "--mscale-all-dim", type=float,
                       default=DEFAULTS["yarn_mscale_all_dim"], dest="yarn_mscale_all_dim",
                       help="yarn: see --yarn-mscale.")
    group.add_argument("--yarn-attention-factor", type=float,
                       help="yarn: the factor the cos and sin tables are multiplied by, instead of the one "
                            "--yarn-mscale gives (transformers' attention_factor).")
    group.add_argument("--yarn-correction-range-round-to-int", action="store_true",
                       default=DEFAULTS["yarn_correction_range_round_to_int"],
                       help="yarn: round the blended channel range outwards to whole channels (transformers' "
                            "truncate; on by default).")
    group.add_argument("--no-yarn-correction-range-round-to-int", action="store_false",
                       dest="yarn_correction_range_round_to_int",
                       help="yarn: blend over the exact channel range (transformers' truncate: false).")


def _add_numerics_flags(parser) -> None:
    group = parser.add_argument_group("model numerics and initialisation")
    group.add_argument("--layernorm-epsilon", type=float, default=1e-5, help="Epsilon of every LayerNorm.")
    group.add_argument("--no-query-key-layer-scaling", action="store_false", default=True,
                       dest="apply_query_key_layer_scaling",
                       help="Turn off query-key layer scaling (on by default, as upstream).")
    group.add_argument("--apply-query-key-layer-scaling", action="store_true", default=True,
                       dest="apply_query_key_layer_scaling",
                       help="Unfused attention divides the scores by the layer number before the softmax and "
                            "multiplies them back inside it (in fp32), so fp16 scores cannot overflow. The "
                            "result is mathematically unchanged. On by default.")
    group.add_argument("--attention-softmax-in-fp32", action="store_true",
                       help="Unfused attention computes masking and softmax in fp32 (implied by query-key layer "
                            "scaling). The fused kernel always does.")
    group.add_argument("--fp32-residual-connection", action="store_true",
                       help="Keep the residual stream in fp32 under --fp16/--bf16.")
    group.add_argument("--use-cpu-initialization", action="store_true", default=None,
                       help="Initialise full weights on the CPU, then shard them. Always so here: every rank "
                            "builds the single-process weights on the CPU and keeps its shard.")
    group.add_argument("--init-method-xavier-uniform", action="store_true",
                       help="Initialise weight matrices (embeddings included) Xavier-uniform instead of "
                            "normal(0, --init-method-std), as upstream's ViT does.")
    group.add_argument("--encoder-seq-length", type=int,
                       help="Upstream's other spelling of --seq-length (give one of them).")
    group.add_argument("--onnx-safe", type=bool, required=False,
                       help="Accepted; no effect: the model has no ONNX-unsafe operation (GeLU is the erf form).")


def _add_kernel_switches(parser) -> None:
    kernels = parser.add_argument_group(
        "kernel switches", "Upstream's fusion switches. Where a fused kernel exists here (attention: PyTorch's "
        "scaled_dot_product_attention or the device's registered kernel) the switch selects the unfused path; "
        "the others name fusions this code base does not have, so they change nothing.")
    kernels.add_argument("--torch-compile", action="store_true",
                         help="Compile the model with torch.compile: the plain engine's model whole, from the "
                              "embedding to the loss, so bias and GeLU, residual add and norm, and the loss's fp32 "
                              "math fuse; on the pipeline engine each piece of a stage. The first iterations take "
                              "longer while it compiles. Off by default: on one H200 it was 1.6 percent (345M) and 2.9 "
                              "percent (1.3B) faster for 35-70 s of compiling at every start; on CUDA the loss's "
                              "chunk math is compiled in eager runs too (docs/benchmarks.md).")
    kernels.add_argument("--no-masked-softmax-fusion", action="store_false", dest="masked_softmax_fusion",
                         help="Attention by explicit matmul, mask and softmax (honouring query-key layer scaling "
                              "and --attention-softmax-in-fp32) instead of the fused kernel.")
    kernels.add_argument("--no-bias-gelu-fusion", action="store_false", dest="bias_gelu_fusion",
                         help="No effect: bias add and GeLU are fused by --torch-compile, not by a kernel of "
                              "their own.")
    kernels.add_argument("--no-bias-dropout-fusion", action="store_false", dest="bias_dropout_fusion",
                         help="No effect: bias add and dropout are separate operations here.")
    kernels.add_argument("--no-gradient-accumulation-fusion", action="store_false",
                         dest="gradient_accumulation_fusion",
                         help="No effect: DeepSpeed accumulates weight gradients.")
    kernels.add_argument("--use-flash-attn", "--use-flash-attn-v1", "--use-flash-attn-v2", "--use-flash-attn-triton",
                         "--use-flash-attn-builder", action="store_true", dest="use_flash_attn",
                         help="Upstream's FlashAttention packages (v1, v2, Triton, DeepSpeed's builder) are not "
                              "used: attention always runs on the device's fastest fused kernel (PyTorch's "
                              "scaled_dot_product_attention, which takes its flash path where the device and dtype "
                              "have one, or torch_npu's fusion attention); the run says so in one line.")


def after_parse(values: Mapping) -> dict:
    """--encoder-seq-length is --seq-length under its upstream alias; Megatron-LM's
    --rotary-seq-len-interpolation-factor is the linear rotary scaling."""
    alias, seq_length = values["encoder_seq_length"], values["seq_length"]
    if seq_length is not None and alias is not None and seq_length != alias:
        raise InputError(f"--seq-length {seq_length} and --encoder-seq-length {alias} "
                         "name the same length; give one of them")
    return {**({} if alias is None else {"seq_length": alias}), **_interpolation(values)}


def _interpolation(values: Mapping) -> dict:
    factor = values["rotary_seq_len_interpolation_factor"]
    if factor is None:
        return {}
    if values["rope_scaling_type"] not in (None, "linear") or values["rope_scaling_factor"] not in (None, factor):
        raise InputError(f"--rotary-seq-len-interpolation-factor {factor} is the linear rotary scaling; it cannot "
                         f"go with --rope-scaling-type {values['rope_scaling_type']} --rope-scaling-factor "
                         f"{values['rope_scaling_factor']}: give one of them")
    return {"rope_scaling_type": "linear", "rope_scaling_factor": float(factor)}


def shape(values: Mapping) -> dict:
    """The default MLP, position-table and key/value head counts, checked against each other and the
    tensor-parallel size; rotary positions turn the learned table off (upstream's rule)."""
    hidden, seq_length = values["hidden_size"], values["seq_length"]
    ffn = values["ffn_hidden_size"] if values["ffn_hidden_size"] is not None else 4 * hidden
    positions = values["max_position_embeddings"]
    positions = seq_length if positions is None else positions
    tp = values["tensor_model_parallel_size"]
    if seq_length > positions:
        raise InputError(
            f"--seq-length {seq_length} is above --max-position-embeddings {positions}; raise "
            f"--max-position-embeddings to at least {seq_length} or shorten --seq-length")
    if values["kv_channels"] is None:
        require_divisible("--hidden-size", hidden, "--num-attention-heads", values["num_attention_heads"],
                          "pick a hidden size that is a multiple of the head count, or give --kv-channels")
    for dest, value in (("num_attention_heads", values["num_attention_heads"]), ("ffn_hidden_size", ffn)):
        require_divisible(flag(dest), value, "--tensor-model-parallel-size", tp,
                          f"tensor parallelism splits it evenly, so choose a multiple of {tp} or a smaller "
                          f"tensor parallel size")
    heads = values["num_attention_heads"]
    kv_heads = values["num_key_value_heads"] if values["num_key_value_heads"] is not None else heads
    require_divisible("--num-attention-heads", heads, "--num-key-value-heads", kv_heads,
                      "each key/value head serves a whole group of query heads")
    require_divisible("--num-key-value-heads", kv_heads, "--tensor-model-parallel-size", tp,
                      "each tensor-parallel rank holds whole query groups; lower the tensor-parallel size to a "
                      "divisor of the key/value heads")
    if not 0.0 < values["rotary_percent"] <= 1.0:
        raise InputError(f"--rotary-percent {values['rotary_percent']} must be in (0, 1]")
    if values["rope_scaling_type"] is not None and not values["use_rotary_position_embeddings"]:
        raise InputError(f"--rope-scaling-type {values['rope_scaling_type']} scales rotary position embeddings; "
                         "add --use-rotary-position-embeddings or drop it")
    return {"ffn_hidden_size": ffn, "max_position_embeddings": positions, "num_key_value_heads": kv_heads,
            "window_size": window_size(values["window_size"]),
            "add_position_embedding": values["add_position_embedding"] and
            not values["use_rotary_position_embeddings"]}


def window_size(flag: Union[str, int, None]) -> Optional[int]:
    """Megatron-LM's --window-size "LEFT,RIGHT" (or LEFT; a preset's int is LEFT) as the model's window_size: LEFT,
    or None for no window."""
    if flag is None:
        return None
    parts = str(flag).split(",")
    if len(parts) > 2 or not all(part.strip().lstrip("-").isdigit() for part in parts):
        raise InputError(f"--window-size {flag!r} is not LEFT,RIGHT (two integers, e.g. 4095,0) or LEFT")
    left, right = (int(part) for part in (parts + ["0"])[:2])
    if right != 0 or left < -1:
        raise InputError(f"--window-size {flag}: only causal windows are supported, LEFT 0 or more (or -1 for "
                         "none) and RIGHT 0, e.g. --window-size 4095,0")
    return None if left == -1 else left


def validate(values: Mapping) -> None:
    if values["fp32_residual_connection"] and not (values["fp16"] or values["bf16"]):
        raise InputError("--fp32-residual-connection keeps the residual stream in fp32 while the model runs in "
                         "half precision; add --fp16 or --bf16, or drop it (an fp32 run is fp32 throughout)")
    if values["layernorm_epsilon"] <= 0:
        raise InputError(f"--layernorm-epsilon {values['layernorm_epsilon']} must be greater than 0, e.g. 1e-5")
    section(values)  # ModelConfig's own checks (a rotary scaling type's parameters) before the run starts


def section(values: Mapping) -> ModelConfig:
    return ModelConfig.from_flags(values)
