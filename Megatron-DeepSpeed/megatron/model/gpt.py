"""The Megatron GPT model (GPT-2, and the Llama family through the config's architecture fields), readable in one
sitting.

    tokens -> Embedding (word + learned position unless rotary / none, dropout)
           -> num_layers x TransformerLayer (pre-norm attention and MLP, each added to the residual)
           -> final norm -> LMHead (tied to the word embedding, or an output layer of its own) -> LanguageModelLoss

The architecture fields (GPT-2's defaults): `normalization` LayerNorm or RMSNorm; `add_position_embedding`, and
rotary embeddings on queries and keys (model/rotary.py; `rope_scaling`, families/rope_scaling.py); `window_size`,
sliding-window attention (model/attention_spec.py); `swiglu`, a SiLU-gated MLP; `num_key_value_heads` below the
head count, grouped-query attention; `add_bias_linear`, `add_qkv_bias`; `untie_embeddings_and_output_weights`.

Each piece takes and returns plain tensors and keeps no state shared with another piece, so the pipeline
model (model/pipe.py) builds the same network from the same pieces, one DeepSpeed LayerSpec per piece. Each
piece draws its initial weights from its own random stream, seeded by (init_seed, piece index), so the weights
do not depend on which process or pipeline stage builds which piece. Parallelism is applied from outside by a
plan keyed by module path (model/parallelize.py); the model itself knows nothing about it. Tensors are
batch-first: hidden states are [batch, seq, hidden]. Parameter names follow Megatron, so it is obvious which
linears become column-parallel (self_attention.query_key_value, mlp.dense_h_to_4h) or row-parallel
(self_attention.dense, mlp.dense_4h_to_h) under tensor parallelism.
"""
import contextlib
import functools
import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from megatron.errors import InputError, require_divisible
from megatron.families.rope_scaling import RopeScaling
from megatron.model.attention_spec import AttentionSpec
from megatron.model.cross_entropy import ChunkKernels, cross_entropy
from megatron.model.kernels import PORTABLE_KERNELS, Kernels, repeats_grouped_kv
from megatron.model.rotary import RotaryEmbedding
from megatron.model.unfused_attention import UnfusedAttention


@dataclass
class GPTConfig:
    vocab_size: int  # already padded (see docs/ARCHITECTURE.md, Data formats)
    max_position_embeddings: int
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: Optional[int] = None  # None: 4 * hidden_size; with swiglu the width of each branch
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    init_method_std: float = 0.02
    openai_gelu: bool = False
    layernorm_epsilon: float = 1e-5
    checkpoint_activations: bool = False
    checkpoint_num_layers: int = 1  # layers per recomputed chunk
    # Upstream main's recomputation (see recomputed_chunks): None, "full" (whole layers, by recompute_method
    # "uniform" or "block") or "selective" (each layer's attention core).
    recompute_granularity: Optional[str] = None
    recompute_method: Optional[str] = None
    recompute_num_layers: int = 1
    init_seed: int = 1234  # with the piece index, decides every initial weight (see seeded_init)
    init_method_xavier_uniform: bool = False  # weight matrices Xavier-uniform instead of normal(0, std)
    fp32_residual_connection: bool = False  # under half precision, the residual stream stays fp32
    # Attention: the kernel (kernels.attention), or Megatron's unfused math with its fp16 safeguards.
    masked_softmax_fusion: bool = True
    apply_query_key_layer_scaling: bool = True
    attention_softmax_in_fp32: bool = False
    kernels: Kernels = PORTABLE_KERNELS  # attention and layer norm implementations (megatron/model/kernels.py)
    torch_compile: bool = False  # model/provider.py compiles the model (--torch-compile)
    # Mixture of experts (None: dense): config/job.py's MoEConfig, which model/moe.py reads to build those layers
    # with DeepSpeed's MoE; this file stays dense.
    moe: Optional[object] = None
    # Architecture variants (the module docstring); the defaults are GPT-2's.
    normalization: str = "layernorm"  # or "rmsnorm"
    add_position_embedding: bool = True
    use_rotary_position_embeddings: bool = False
    rotary_percent: float = 1.0
    rope_theta: int = 10000
    rope_scaling: RopeScaling = RopeScaling()  # llama3 / linear / yarn frequencies (families/rope_scaling.py)
    # Sliding-window attention (None: none): each query sees itself and the window_size keys before it
    # (model/attention_spec.py, which also maps Hugging Face's sliding_window to it).
    window_size: Optional[int] = None
    swiglu: bool = False
    num_key_value_heads: Optional[int] = None  # None: num_attention_heads
    add_bias_linear: bool = True
    untie_embeddings_and_output_weights: bool = False
    add_qkv_bias: bool = False  # biases on the QKV projection even without add_bias_linear (Qwen2)
    kv_channels: Optional[int] = None  # each head's size (None: hidden_size / num_attention_heads)
    qk_layernorm: bool = False  # each query and key head normalised before rotary (Qwen3)

    def __post_init__(self):
        if self.ffn_hidden_size is None:
            self.ffn_hidden_size = 4 * self.hidden_size
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        for flag, value in (("vocab_size (the padded vocabulary)", self.vocab_size),
                            ("--max-position-embeddings", self.max_position_embeddings),
                            ("--num-layers", self.num_layers), ("--hidden-size", self.hidden_size),
                            ("--num-attention-heads", self.num_attention_heads),
                            ("--ffn-hidden-size", self.ffn_hidden_size),
                            ("--num-key-value-heads", self.num_key_value_heads)):
            if value <= 0:
                raise InputError(f"{flag} is {value}; it must be a positive integer")
        if self.kv_channels is None:
            require_divisible("--hidden-size", self.hidden_size, "--num-attention-heads", self.num_attention_heads,
                              "pick a hidden size that is a multiple of the head count, or give --kv-channels")
        elif self.kv_channels <= 0:
            raise InputError(f"--kv-channels is {self.kv_channels}; it must be a positive integer")
        require_divisible("--num-attention-heads", self.num_attention_heads, "--num-key-value-heads",
                          self.num_key_value_heads, "each key/value head serves a whole group of query heads")
        if self.normalization not in NORMALIZATIONS:
            raise InputError(f"--normalization {self.normalization!r} is not one of {', '.join(NORMALIZATIONS)}")
        for flag, value in (("--hidden-dropout", self.hidden_dropout),
                            ("--attention-dropout", self.attention_dropout)):
            if not 0.0 <= value < 1.0:
                raise InputError(f"{flag} is {value}; a dropout probability must be in [0, 1)")

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def output_layer_init_std(self) -> float:
        """Smaller init for the projections that write into the residual stream, so its variance does not
        grow with depth (GPT-2 / Megatron scaling)."""
        return self.init_method_std / math.sqrt(2.0 * self.num_layers)


NORMALIZATIONS = ("layernorm", "rmsnorm")
EMBEDDING_PIECE = 0  # seed indices (seeded_init): the embedding, the layers 1..num_layers, an untied output layer


def layer_piece(layer_number: int) -> int:
    return 1 + layer_number


def output_layer_piece(config: GPTConfig) -> int:
    return layer_piece(config.num_layers)


@contextlib.contextmanager
def seeded_init(config: GPTConfig, piece_index: int):
    """Build a piece inside: its random initialisation then comes from torch's CPU generator seeded with
    init_seed + piece_index (DeepSpeed's seed_layers rule), whichever process, pipeline stage or construction
    order builds it; the caller's random stream is left where it was. Pieces are built on the CPU."""
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(config.init_seed + piece_index)
        yield


def init_weight(weight: torch.Tensor, std: float, config: GPTConfig) -> None:
    if config.init_method_xavier_uniform:
        nn.init.xavier_uniform_(weight)
    else:
        nn.init.normal_(weight, mean=0.0, std=std)


def init_linear(layer: nn.Linear, std: float, config: GPTConfig) -> nn.Linear:
    init_weight(layer.weight, std, config)
    if layer.bias is not None:
        nn.init.zeros_(layer.bias)
    return layer


def linear(config: GPTConfig, in_features: int, out_features: int, std: float, bias: bool = False) -> nn.Linear:
    """A linear layer initialised as Megatron does (init_weight, zero bias), with a bias unless disabled (or
    `bias` asks for one anyway)."""
    return init_linear(nn.Linear(in_features, out_features, bias=config.add_bias_linear or bias), std, config)


def layer_norm(config: GPTConfig, size: Optional[int] = None) -> nn.Module:
    """The norm the config names (the kernels' LayerNorm or RMSNorm) over `size` channels (None: the hidden
    size), with --layernorm-epsilon."""
    kind = config.kernels.rms_norm if config.normalization == "rmsnorm" else config.kernels.layer_norm
    return kind(size or config.hidden_size, eps=config.layernorm_epsilon)


def normalize(norm: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """norm(hidden) in the norm's dtype. An fp32 residual stream under half-precision weights is normalised in
    fp32 (weights upcast) and only the result is rounded, so the stream itself never loses precision."""
    if hidden.dtype == norm.weight.dtype:
        return norm(hidden)
    bias = getattr(norm, "bias", None)
    if bias is None:  # RMSNorm
        return F.rms_norm(hidden.float(), norm.normalized_shape, norm.weight.float(), norm.eps).to(norm.weight.dtype)
    return F.layer_norm(hidden.float(), norm.normalized_shape, norm.weight.float(), bias.float(),
                        norm.eps).to(norm.weight.dtype)


class Embedding(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = None
        if config.add_position_embedding:
            self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        # Both tables are built before either is initialised: the random draws, and so the weights of a seed,
        # stay those of every earlier version.
        for table in filter(None, (self.word_embeddings, self.position_embeddings)):
            init_weight(table.weight, config.init_method_std, config)
        self.dropout = nn.Dropout(config.hidden_dropout)
        self.fp32_residual_connection = config.fp32_residual_connection

    def forward(self, tokens: torch.Tensor, position_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        embedded = self.word_embeddings(tokens)
        if self.position_embeddings is not None:
            embedded = embedded + self.position_embeddings(self.checked_positions(tokens, position_ids))
        return self.dropout(embedded.float() if self.fp32_residual_connection else embedded)

    def checked_positions(self, tokens: torch.Tensor, position_ids: Optional[torch.Tensor]) -> torch.Tensor:
        seq_length, max_positions = tokens.shape[1], self.position_embeddings.num_embeddings
        if seq_length > max_positions:
            raise InputError(f"sequence length {seq_length} exceeds --max-position-embeddings {max_positions}; "
                             "lower --seq-length or raise --max-position-embeddings")
        if position_ids is None:
            position_ids = torch.arange(seq_length, device=tokens.device).unsqueeze(0)
        return position_ids


class SelfAttention(nn.Module):
    def __init__(self, config: GPTConfig, layer_number: int = 1):
        """layer_number: 1-based, as Megatron counts (query-key layer scaling divides by it)."""
        super().__init__()
        self.num_heads, self.num_groups = config.num_attention_heads, config.num_key_value_heads
        self.queries_per_group = config.num_attention_heads // config.num_key_value_heads
        self.head_dim = config.head_dim
        self.spec = AttentionSpec(window_size=config.window_size, dropout_p=config.attention_dropout)
        # Output features ordered [query groups, (its queries..., key, value), head_dim] (Megatron's grouped
        # layout; without grouped-query attention [heads, (q, k, v), head_dim]): splitting them across
        # tensor-parallel ranks hands each rank whole query groups.
        qkv_features = (config.num_attention_heads + 2 * config.num_key_value_heads) * config.head_dim
        self.query_key_value = linear(config, config.hidden_size, qkv_features, config.init_method_std,
                                      bias=config.add_qkv_bias)
        self.dense = linear(config, config.num_attention_heads * config.head_dim, config.hidden_size,
                            config.output_layer_init_std)
        # Per-head norms of queries and keys (one weight of head_dim shared by the heads, replicated on every
        # tensor-parallel rank: model/parallelize.py sums its gradient over them)
        self.q_norm, self.k_norm = ((layer_norm(config, config.head_dim), layer_norm(config, config.head_dim))
                                    if config.qk_layernorm else (None, None))
        self.rotary = None
        if config.use_rotary_position_embeddings:
            self.rotary = RotaryEmbedding.for_heads(config.head_dim, config.rotary_percent, config.rope_theta,
                                                    config.kernels.rotary_mul, config.rope_scaling)
        self.attend = config.kernels.attention if config.masked_softmax_fusion else UnfusedAttention(
            layer_number, config.apply_query_key_layer_scaling, config.attention_softmax_in_fp32)
        self.recompute_core = config.recompute_granularity == "selective"
        # How selective recomputation recomputes the core; tensor parallelism swaps in one that also rewinds its
        # own random streams (attention dropout draws from them).
        self.checkpoint_core = checkpoint_layer
        # Which equal chunk of the sequence `hidden` is (model/ulysses.py sets it under DeepSpeed-Ulysses, which
        # also swaps `attend` for an all-to-all around it): without position ids, rotary positions start there.
        self.sequence_chunk_index = 0

    def forward(self, hidden: torch.Tensor, position_ids: Optional[torch.Tensor] = None,
                segment_ids: Optional[torch.Tensor] = None, kv_cache=None) -> torch.Tensor:
        """position_ids [batch, seq] of `hidden`'s tokens turn the rotary embedding (None: consecutive positions);
        segment_ids [batch, all positions]: the packed documents (model/attention_spec.py). kv_cache (text
        generation, megatron/inference): keeps the keys and values of earlier positions, so `hidden` holds only
        the new ones."""
        qkv = self.query_key_value(hidden)
        # Sizes come from the projection's output: under tensor parallelism it holds only this rank's heads,
        # and under sequence parallelism the whole sequence while `hidden` held only a chunk of it.
        batch, seq_length, _ = qkv.shape
        qkv = qkv.view(batch, seq_length, -1, self.queries_per_group + 2, self.head_dim)
        # One split, not three indexings: its backward writes the three gradients into one tensor in a single
        # pass, where indexing's backward fills a zero tensor of qkv's size for each and adds them up.
        query, key, value = qkv.split((self.queries_per_group, 1, 1), dim=3)
        query = query.flatten(2, 3).transpose(1, 2)  # [b, heads, s, head_dim]
        key, value = (t.squeeze(3).transpose(1, 2) for t in (key, value))  # [b, groups, s, head_dim]
        if self.q_norm is not None:
            query, key = normalize(self.q_norm, query), normalize(self.k_norm, key)
        if self.rotary is not None:
            if position_ids is None:
                first = self.sequence_chunk_index * seq_length if kv_cache is None else kv_cache.length
                position_ids = torch.arange(first, first + seq_length, device=qkv.device).unsqueeze(0)
            query, key = self.rotary(query, position_ids), self.rotary(key, position_ids)
        if kv_cache is not None:
            key, value = kv_cache.extend(key, value)
        if self.queries_per_group > 1 and repeats_grouped_kv(self.attend):
            # each key/value head serves its group's query heads (a kernel that takes them grouped pairs them itself)
            key, value = (t.repeat_interleave(self.queries_per_group, dim=1) for t in (key, value))
        if self.recompute_core and torch.is_grad_enabled():
            # Only tensors go in (DeepSpeed's partitioned checkpointing miscounts a None argument).
            segments = () if segment_ids is None else (segment_ids,)
            context = self.checkpoint_core(functools.partial(self.attend_core, self.training), query, key, value,
                                           *segments)
        else:
            context = self.attend_core(self.training, query, key, value, segment_ids)
        return self.dense(context.transpose(1, 2).reshape(batch, seq_length, -1))

    def attend_core(self, training: bool, query, key, value, segment_ids=None) -> torch.Tensor:
        return self.attend(query, key, value, self.spec.for_batch(segment_ids, training))


class MLP(nn.Module):
    """GeLU MLP, or with swiglu SiLU(gate) * up: then dense_h_to_4h holds both branches, its output features
    [gate; up] halves as upstream Megatron-DeepSpeed's (a tensor-parallel rank holds [gate_r; up_r]: the plan splits
    each half), which the kernel takes as they come."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.swiglu = config.kernels.swiglu if config.swiglu else None
        branches = 2 if config.swiglu else 1
        self.dense_h_to_4h = linear(config, config.hidden_size, branches * config.ffn_hidden_size,
                                    config.init_method_std)
        self.dense_4h_to_h = linear(config, config.ffn_hidden_size, config.hidden_size, config.output_layer_init_std)
        self.gelu_approximation = "tanh" if config.openai_gelu else "none"

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        inner = self.dense_h_to_4h(hidden)
        if self.swiglu is not None:
            return self.dense_4h_to_h(self.swiglu(inner))
        return self.dense_4h_to_h(F.gelu(inner, approximate=self.gelu_approximation))


class TransformerLayer(nn.Module):
    def __init__(self, config: GPTConfig, layer_number: int = 1):
        super().__init__()
        self.input_layernorm = layer_norm(config)
        self.self_attention = SelfAttention(config, layer_number)
        self.post_attention_layernorm = layer_norm(config)
        self.mlp = MLP(config)
        self.dropout = nn.Dropout(config.hidden_dropout)

    def forward(self, hidden: torch.Tensor, position_ids: Optional[torch.Tensor] = None,
                segment_ids: Optional[torch.Tensor] = None, kv_cache=None) -> torch.Tensor:
        hidden = hidden + self.dropout(self.self_attention(normalize(self.input_layernorm, hidden), position_ids,
                                                           segment_ids, kv_cache))
        return hidden + self.dropout(self.mlp(normalize(self.post_attention_layernorm, hidden)))


class LMHead(nn.Module):
    """Scores against every (padded) vocabulary entry. Tied (GPT-2), the weight is the word-embedding matrix,
    passed in at call time so that the tied weight has a single owner; untied, the head holds its own `weight`
    (upstream's output_layer)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.weight = None
        if config.untie_embeddings_and_output_weights:
            self.weight = nn.Parameter(torch.empty(config.vocab_size, config.hidden_size))
            init_weight(self.weight, config.init_method_std, config)

    def forward(self, hidden: torch.Tensor, word_embedding_weight: Optional[torch.Tensor] = None) -> torch.Tensor:
        return F.linear(hidden, word_embedding_weight if self.weight is None else self.weight)


def masked_mean(token_losses: torch.Tensor, loss_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Mean of the per-token losses over the positions where loss_mask is 1 (all positions without a mask)."""
    if loss_mask is None:
        return token_losses.mean()
    loss_mask = loss_mask.flatten().float()
    return (token_losses.flatten() * loss_mask).sum() / loss_mask.sum()


class LanguageModelLoss(nn.Module):
    """Mean token cross entropy over the positions where loss_mask is 1, computed in fp32 so bf16/fp16 logits do
    not lose precision in the softmax (megatron/model/cross_entropy.py: without an fp32 copy of them). The logits
    are the LM head's, made for this loss alone: backward writes their gradient over them. Set from outside:
    vocab_group, the ranks the vocabulary is split across (tensor parallelism). Under --torch-compile the loss is
    traced with the rest of the model (model/provider.py's apply_torch_compile)."""

    def __init__(self, chunk_bytes: int = PORTABLE_KERNELS.loss_chunk_bytes,
                 chunk_kernels: ChunkKernels = PORTABLE_KERNELS.loss_kernels):
        super().__init__()
        self.chunk_bytes, self.chunk_kernels = chunk_bytes, chunk_kernels  # the device's (kernels.loss_*)
        self.vocab_group = None

    def forward(self, logits: torch.Tensor, labels: torch.Tensor,
                loss_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        return masked_mean(cross_entropy(logits, labels, self.vocab_group, self.chunk_bytes, self.chunk_kernels,
                                         overwrite_logits=True), loss_mask)


def checkpoint_layer(layer: nn.Module, *args) -> torch.Tensor:
    """layer(*args) keeping only its inputs; its insides are recomputed during backward, with torch's random
    generators rewound so that dropout masks repeat."""
    return checkpoint(layer, *args, use_reentrant=False)


def recomputed_chunks(config: GPTConfig, num_layers: int) -> list:
    """(start, end, recomputed) for the layers [start, end) of a model or pipeline stage of num_layers layers, as
    the recompute flags say: --checkpoint-activations chunks of checkpoint_num_layers; upstream main's full
    granularity chunks of recompute_num_layers (uniform) or the first recompute_num_layers layers one by one and
    the rest kept (block); otherwise one chunk, not recomputed (selective recomputes inside the layers)."""
    if recomputes_every_layer(config):
        step = config.checkpoint_num_layers if config.checkpoint_activations else config.recompute_num_layers
        return [(start, min(start + step, num_layers), True) for start in range(0, num_layers, step)]
    if config.recompute_granularity == "full":  # block
        recomputed = min(config.recompute_num_layers, num_layers)
        kept = [(recomputed, num_layers, False)] if recomputed < num_layers else []
        return [(layer, layer + 1, True) for layer in range(recomputed)] + kept
    return [(0, num_layers, False)]


def recomputes_every_layer(config) -> bool:
    """Whether the recompute flags recompute every whole layer (--checkpoint-activations, or full granularity by
    the uniform method): what FLOPs counts and the planner's recompute mean. Block and selective recompute less."""
    return config.checkpoint_activations or (config.recompute_granularity, config.recompute_method) == (
        "full", "uniform")


def recomputed_checkpoints(config) -> int:
    """How many checkpointed calls one forward of the whole model makes (at least 1): DeepSpeed's contiguous
    checkpoint buffers are sized by it. `config`: a GPTConfig or the ModelConfig of the same-named flags."""
    chunks = sum(recomputed for _, _, recomputed in recomputed_chunks(config, config.num_layers))
    return max(1, chunks + (config.num_layers if config.recompute_granularity == "selective" else 0))


def layer_inputs(position_ids: Optional[torch.Tensor], segment_ids: Optional[torch.Tensor]) -> tuple:
    """(names, tensors) of the layers' keyword inputs that are given: passed on as plain tensors, since
    DeepSpeed's partitioned checkpointing miscounts a None argument."""
    given = {name: tensor for name, tensor in (("position_ids", position_ids), ("segment_ids", segment_ids))
             if tensor is not None}
    return tuple(given), tuple(given.values())


def run_layers(layers, names: tuple, hidden: torch.Tensor, *tensors: torch.Tensor) -> torch.Tensor:
    """The layers in turn; `tensors` are their keyword inputs `names` (layer_inputs)."""
    inputs = dict(zip(names, tensors))
    for layer in layers:
        hidden = layer(hidden, **inputs)
    return hidden


def keep_whole(piece: nn.Module, path: str) -> nn.Module:
    return piece


class GPTModel(nn.Module):
    def __init__(self, config: GPTConfig, prepare=keep_whole):
        """prepare(piece, path): what this process keeps of each piece (embedding, each layer, final norm, head,
        loss), given the piece and its path here as soon as it is built, e.g. its tensor-parallel shard
        (model/parallelize.py). A process then never holds more than its part plus one whole piece."""
        super().__init__()
        self.config = config
        with seeded_init(config, EMBEDDING_PIECE):
            self.embedding = prepare(Embedding(config), "embedding")
        self.layers = nn.ModuleList()
        for layer_number in range(config.num_layers):
            with seeded_init(config, layer_piece(layer_number)):
                self.layers.append(prepare(TransformerLayer(config, layer_number + 1), f"layers.{layer_number}"))
        self.final_layernorm = prepare(layer_norm(config), "final_layernorm")
        with seeded_init(config, output_layer_piece(config)):
            self.lm_head = prepare(LMHead(config), "lm_head")
        self.loss = prepare(LanguageModelLoss(config.kernels.loss_chunk_bytes, config.kernels.loss_kernels), "loss")
        # How --checkpoint-activations recomputes a layer; tensor parallelism swaps in one that also rewinds
        # its own random streams.
        self.checkpoint_layer = checkpoint_layer

    def forward(self, tokens: torch.Tensor, position_ids: Optional[torch.Tensor] = None,
                segment_ids: Optional[torch.Tensor] = None, labels: Optional[torch.Tensor] = None,
                loss_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Logits [batch, seq, vocab] (under tensor parallelism this rank's vocabulary slice); or, given labels,
        the scalar loss.

        position_ids: each token's position (learned and rotary embeddings; None: 0, 1, ...); segment_ids: None
        for one causal stream, else int64 [batch, seq] packed documents (model/attention_spec.py).
        """
        hidden = self.transformer(self.embedding(tokens, position_ids), position_ids, segment_ids)
        return self.head(hidden, labels, loss_mask)

    @property
    def device(self) -> torch.device:
        """Where the model's weights are (what callers move their inputs to)."""
        return next(self.parameters()).device

    def layer_chunks(self) -> list:
        """(layers, recomputed) of each chunk the recompute flags make (recomputed_chunks); one chunk, not
        recomputed, where no gradient is taken."""
        if not torch.is_grad_enabled():
            return [(self.layers, False)]
        return [(self.layers[start:end], recomputed)
                for start, end, recomputed in recomputed_chunks(self.config, len(self.layers))]

    def transformer(self, hidden: torch.Tensor, position_ids: Optional[torch.Tensor] = None,
                    segment_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        names, tensors = layer_inputs(position_ids, segment_ids)
        for chunk, recomputed in self.layer_chunks():
            run = functools.partial(run_layers, chunk, names)
            hidden = self.checkpoint_layer(run, hidden, *tensors) if recomputed else run(hidden, *tensors)
        return hidden

    def head(self, hidden: torch.Tensor, labels: Optional[torch.Tensor] = None,
             loss_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        tied = None if self.config.untie_embeddings_and_output_weights else self.embedding.word_embeddings.weight
        logits = self.lm_head(normalize(self.final_layernorm, hidden), tied)
        return logits if labels is None else self.loss(logits, labels, loss_mask)
