"""Model flags of Megatron-DeepSpeed beyond the core shape flags: numerics, initialisation, kernel switches."""
from megatron.errors import InputError


def add_flags(parser) -> None:
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

    kernels = parser.add_argument_group(
        "kernel switches", "Upstream's fusion switches. Where a fused kernel exists here (attention: PyTorch's "
        "scaled_dot_product_attention or the device's registered kernel) the switch selects the unfused path; "
        "the others name fusions this code base does not have, so they change nothing.")
    kernels.add_argument("--torch-compile", action="store_true",
                         help="Compile each transformer layer with torch.compile (fuses its elementwise work; "
                              "the first iterations take longer while it compiles). Off by default.")
    kernels.add_argument("--no-masked-softmax-fusion", action="store_false", dest="masked_softmax_fusion",
                         help="Attention by explicit matmul, mask and softmax (honouring query-key layer scaling "
                              "and --attention-softmax-in-fp32) instead of the fused kernel.")
    kernels.add_argument("--no-bias-gelu-fusion", action="store_false", dest="bias_gelu_fusion",
                         help="No effect: bias add and GeLU are separate operations here.")
    kernels.add_argument("--no-bias-dropout-fusion", action="store_false", dest="bias_dropout_fusion",
                         help="No effect: bias add and dropout are separate operations here.")
    kernels.add_argument("--no-gradient-accumulation-fusion", action="store_false",
                         dest="gradient_accumulation_fusion",
                         help="No effect: DeepSpeed accumulates weight gradients.")
    kernels.add_argument("--use-flash-attn", "--use-flash-attn-v1", "--use-flash-attn-v2", action="store_true",
                         dest="use_flash_attn",
                         help="No effect: the fused attention kernel already takes a flash-attention path where "
                              "the device and dtype have one.")


def after_parse(args) -> None:
    """--encoder-seq-length is --seq-length under its upstream alias."""
    if args.encoder_seq_length is None:
        return
    if args.seq_length is not None and args.seq_length != args.encoder_seq_length:
        raise InputError(f"--seq-length {args.seq_length} and --encoder-seq-length {args.encoder_seq_length} "
                         "name the same length; give one of them")
    args.seq_length = args.encoder_seq_length


def validate(args) -> None:
    if args.fp32_residual_connection and not (args.fp16 or args.bf16):
        raise InputError("--fp32-residual-connection keeps the residual stream in fp32 while the model runs in "
                         "half precision; add --fp16 or --bf16, or drop it (an fp32 run is fp32 throughout)")
    if args.layernorm_epsilon <= 0:
        raise InputError(f"--layernorm-epsilon {args.layernorm_epsilon} must be greater than 0, e.g. 1e-5")
