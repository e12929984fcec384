"""Model flags: the shape (--num-layers ... or a --model-size preset), numerics, initialisation and upstream's
kernel switches; their checks, and the ModelConfig section."""
from typing import Mapping

from megatron.config.flags.common import Limits, after_preset, flag
from megatron.config.model_config import DEFAULTS, SWITCHES, ModelConfig
from megatron.config.presets import preset_names
from megatron.errors import InputError, require_divisible

LIMITS = Limits(required=("num_layers", "hidden_size", "num_attention_heads", "seq_length"),
                positive=("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "seq_length",
                          "max_position_embeddings", "make_vocab_size_divisible_by", "num_key_value_heads",
                          "rope_theta"),
                non_negative=("init_method_std",),
                fractions=("hidden_dropout", "attention_dropout"))
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
    group.add_argument("--no-position-embedding", action="store_false", default=None, dest="add_position_embedding",
                       help="No learned absolute position table.")
    group.add_argument("--swiglu", action="store_true", default=None,
                       help="SiLU-gated MLP (SwiGLU): two input branches of --ffn-hidden-size each, one output "
                            "projection.")
    group.add_argument("--num-key-value-heads", type=int,
                       help="Key/value heads (grouped-query attention; 1: multi-query). Default "
                            "--num-attention-heads.")
    group.add_argument("--disable-bias-linear", action="store_false", default=None, dest="add_bias_linear",
                       help="No biases in the attention and MLP linears (norms keep theirs).")
    group.add_argument("--untie-embeddings-and-output-weights", action="store_true", default=None,
                       help="An output layer of its own instead of scoring against the word embeddings.")
    for name, text in SWITCHES.items():
        group.add_argument(flag(name), action="store_true", default=None, help=text)


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
                              "longer while it compiles. Off by default on every device: only the earlier "
                              "layer-by-layer compile was measured (5 to 7 percent faster on an H100); the device check's "
                              "eager and compiled cells settle the whole model's (docs/benchmarks.md).")
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
    """--encoder-seq-length is --seq-length under its upstream alias."""
    alias, seq_length = values["encoder_seq_length"], values["seq_length"]
    if alias is None:
        return {}
    if seq_length is not None and seq_length != alias:
        raise InputError(f"--seq-length {seq_length} and --encoder-seq-length {alias} "
                         "name the same length; give one of them")
    return {"seq_length": alias}


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
    require_divisible("--hidden-size", hidden, "--num-attention-heads", values["num_attention_heads"],
                      "pick a hidden size that is a multiple of the head count")
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
    return {"ffn_hidden_size": ffn, "max_position_embeddings": positions, "num_key_value_heads": kv_heads,
            "add_position_embedding": values["add_position_embedding"] and
            not values["use_rotary_position_embeddings"]}


def validate(values: Mapping) -> None:
    if values["fp32_residual_connection"] and not (values["fp16"] or values["bf16"]):
        raise InputError("--fp32-residual-connection keeps the residual stream in fp32 while the model runs in "
                         "half precision; add --fp16 or --bf16, or drop it (an fp32 run is fp32 throughout)")
    if values["layernorm_epsilon"] <= 0:
        raise InputError(f"--layernorm-epsilon {values['layernorm_epsilon']} must be greater than 0, e.g. 1e-5")


def section(values: Mapping) -> ModelConfig:
    return ModelConfig.from_flags(values)
