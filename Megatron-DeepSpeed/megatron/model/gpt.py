"""The Megatron GPT model (= GPT-2 architecture), readable in one sitting.

    tokens -> Embedding (word + learned position, dropout)
           -> num_layers x TransformerLayer (pre-LayerNorm attention and MLP, each added to the residual)
           -> final LayerNorm -> LMHead (tied to the word embedding) -> LanguageModelLoss

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
from megatron.model.cross_entropy import EAGER_CHUNK_KERNELS, cross_entropy
from megatron.model.kernels import PORTABLE_KERNELS, Kernels
from megatron.model.unfused_attention import UnfusedAttention


@dataclass
class GPTConfig:
    vocab_size: int  # already padded (see docs/ARCHITECTURE.md, Data formats)
    max_position_embeddings: int
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: Optional[int] = None  # None: 4 * hidden_size
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
    torch_compile: bool = False  # model/provider.py compiles each layer (--torch-compile)
    # Mixture of experts (None: dense): config/job.py's MoEConfig, which model/moe.py reads to build those layers
    # with DeepSpeed's MoE; this file stays dense.
    moe: Optional[object] = None

    def __post_init__(self):
        if self.ffn_hidden_size is None:
            self.ffn_hidden_size = 4 * self.hidden_size
        for flag, value in (("vocab_size (the padded vocabulary)", self.vocab_size),
                            ("--max-position-embeddings", self.max_position_embeddings),
                            ("--num-layers", self.num_layers), ("--hidden-size", self.hidden_size),
                            ("--num-attention-heads", self.num_attention_heads),
                            ("--ffn-hidden-size", self.ffn_hidden_size)):
            if value <= 0:
                raise InputError(f"{flag} is {value}; it must be a positive integer")
        require_divisible("--hidden-size", self.hidden_size, "--num-attention-heads", self.num_attention_heads,
                          "pick a hidden size that is a multiple of the head count")
        for flag, value in (("--hidden-dropout", self.hidden_dropout),
                            ("--attention-dropout", self.attention_dropout)):
            if not 0.0 <= value < 1.0:
                raise InputError(f"{flag} is {value}; a dropout probability must be in [0, 1)")

    @property
    def output_layer_init_std(self) -> float:
        """Smaller init for the projections that write into the residual stream, so its variance does not
        grow with depth (GPT-2 / Megatron scaling)."""
        return self.init_method_std / math.sqrt(2.0 * self.num_layers)


EMBEDDING_PIECE = 0  # seed indices (seeded_init): the embedding, then the layers 1..num_layers


def layer_piece(layer_number: int) -> int:
    return 1 + layer_number


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


def init_linear(linear: nn.Linear, std: float, config: GPTConfig) -> nn.Linear:
    init_weight(linear.weight, std, config)
    nn.init.zeros_(linear.bias)
    return linear


def layer_norm(config: GPTConfig) -> nn.Module:
    return config.kernels.layer_norm(config.hidden_size, eps=config.layernorm_epsilon)


def normalize(norm: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """norm(hidden) in the norm's dtype. An fp32 residual stream under half-precision weights is normalised in
    fp32 (weights upcast) and only the result is rounded, so the stream itself never loses precision."""
    if hidden.dtype == norm.weight.dtype:
        return norm(hidden)
    return F.layer_norm(hidden.float(), norm.normalized_shape, norm.weight.float(), norm.bias.float(),
                        norm.eps).to(norm.weight.dtype)


class Embedding(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        init_weight(self.word_embeddings.weight, config.init_method_std, config)
        init_weight(self.position_embeddings.weight, config.init_method_std, config)
        self.dropout = nn.Dropout(config.hidden_dropout)
        self.fp32_residual_connection = config.fp32_residual_connection

    def forward(self, tokens: torch.Tensor, position_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        seq_length, max_positions = tokens.shape[1], self.position_embeddings.num_embeddings
        if seq_length > max_positions:
            raise InputError(f"sequence length {seq_length} exceeds --max-position-embeddings {max_positions}; "
                             "lower --seq-length or raise --max-position-embeddings")
        if position_ids is None:
            position_ids = torch.arange(seq_length, device=tokens.device).unsqueeze(0)
        embedded = self.word_embeddings(tokens) + self.position_embeddings(position_ids)
        return self.dropout(embedded.float() if self.fp32_residual_connection else embedded)


class SelfAttention(nn.Module):
    def __init__(self, config: GPTConfig, layer_number: int = 1):
        """layer_number: 1-based, as Megatron counts (query-key layer scaling divides by it)."""
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.dropout_p = config.attention_dropout
        # Output features ordered [heads, (q, k, v), head_dim]: splitting them across tensor-parallel ranks
        # hands each rank whole heads.
        self.query_key_value = init_linear(nn.Linear(config.hidden_size, 3 * config.hidden_size),
                                           config.init_method_std, config)
        self.dense = init_linear(nn.Linear(config.hidden_size, config.hidden_size), config.output_layer_init_std,
                                 config)
        self.attend = config.kernels.attention if config.masked_softmax_fusion else UnfusedAttention(
            layer_number, config.apply_query_key_layer_scaling, config.attention_softmax_in_fp32)
        self.recompute_core = config.recompute_granularity == "selective"
        # How selective recomputation recomputes the core; tensor parallelism swaps in one that also rewinds its
        # own random streams (attention dropout draws from them).
        self.checkpoint_core = checkpoint_layer

    def forward(self, hidden: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                kv_cache=None) -> torch.Tensor:
        """kv_cache (text generation, megatron/inference): keeps the keys and values of earlier positions, so
        `hidden` holds only the new ones; attention_mask is then [batch, 1, new, all positions]."""
        qkv = self.query_key_value(hidden)
        # Sizes come from the projection's output: under tensor parallelism it holds only this rank's heads,
        # and under sequence parallelism the whole sequence while `hidden` held only a chunk of it.
        batch, seq_length, _ = qkv.shape
        qkv = qkv.view(batch, seq_length, -1, 3, self.head_dim)
        query, key, value = (qkv[:, :, :, i].transpose(1, 2) for i in range(3))  # [b, heads, s, head_dim]
        if kv_cache is not None:
            key, value = kv_cache.extend(key, value)
        dropout_p = self.dropout_p if self.training else 0.0
        if self.recompute_core and torch.is_grad_enabled():
            # Only tensors go in (DeepSpeed's partitioned checkpointing miscounts a None argument).
            masks = () if attention_mask is None else (attention_mask,)
            context = self.checkpoint_core(functools.partial(self.attend_core, dropout_p), query, key, value, *masks)
        else:
            context = self.attend(query, key, value, attention_mask, dropout_p)
        return self.dense(context.transpose(1, 2).reshape(batch, seq_length, -1))

    def attend_core(self, dropout_p: float, query, key, value, attention_mask=None) -> torch.Tensor:
        return self.attend(query, key, value, attention_mask, dropout_p)


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.dense_h_to_4h = init_linear(nn.Linear(config.hidden_size, config.ffn_hidden_size),
                                         config.init_method_std, config)
        self.dense_4h_to_h = init_linear(nn.Linear(config.ffn_hidden_size, config.hidden_size),
                                         config.output_layer_init_std, config)
        self.gelu_approximation = "tanh" if config.openai_gelu else "none"

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.dense_4h_to_h(F.gelu(self.dense_h_to_4h(hidden), approximate=self.gelu_approximation))


class TransformerLayer(nn.Module):
    def __init__(self, config: GPTConfig, layer_number: int = 1):
        super().__init__()
        self.input_layernorm = layer_norm(config)
        self.self_attention = SelfAttention(config, layer_number)
        self.post_attention_layernorm = layer_norm(config)
        self.mlp = MLP(config)
        self.dropout = nn.Dropout(config.hidden_dropout)

    def forward(self, hidden: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                kv_cache=None) -> torch.Tensor:
        hidden = hidden + self.dropout(self.self_attention(normalize(self.input_layernorm, hidden), attention_mask,
                                                      kv_cache))
        return hidden + self.dropout(self.mlp(normalize(self.post_attention_layernorm, hidden)))


class LMHead(nn.Module):
    """Scores against every (padded) vocabulary entry. The weight is the word-embedding matrix, passed in at
    call time so that the tied weight has a single owner."""

    def forward(self, hidden: torch.Tensor, word_embedding_weight: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, word_embedding_weight)


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
    vocab_group, the ranks the vocabulary is split across (tensor parallelism), and chunk_kernels, the compiled
    per-chunk math under --torch-compile."""

    def __init__(self, chunk_bytes: int = PORTABLE_KERNELS.loss_chunk_bytes):
        super().__init__()
        self.chunk_bytes = chunk_bytes  # the device's (kernels.loss_chunk_bytes)
        self.vocab_group = None
        self.chunk_kernels = EAGER_CHUNK_KERNELS

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


def run_layers(layers, hidden: torch.Tensor, attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    for layer in layers:
        hidden = layer(hidden, attention_mask)
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
        self.lm_head = prepare(LMHead(), "lm_head")
        self.loss = prepare(LanguageModelLoss(config.kernels.loss_chunk_bytes), "loss")
        # How --checkpoint-activations recomputes a layer; tensor parallelism swaps in one that also rewinds
        # its own random streams.
        self.checkpoint_layer = checkpoint_layer

    def forward(self, tokens: torch.Tensor, position_ids: Optional[torch.Tensor] = None,
                attention_mask: Optional[torch.Tensor] = None, labels: Optional[torch.Tensor] = None,
                loss_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Logits [batch, seq, vocab] (under tensor parallelism this rank's vocabulary slice); or, given labels,
        the scalar loss.

        attention_mask: None for causal attention, else bool [batch, 1, seq, seq] with True = masked.
        """
        hidden = self.transformer(self.embedding(tokens, position_ids), attention_mask)
        return self.head(hidden, labels, loss_mask)

    def layer_chunks(self) -> list:
        """(layers, recomputed) of each chunk the recompute flags make (recomputed_chunks); one chunk, not
        recomputed, where no gradient is taken."""
        if not torch.is_grad_enabled():
            return [(self.layers, False)]
        return [(self.layers[start:end], recomputed)
                for start, end, recomputed in recomputed_chunks(self.config, len(self.layers))]

    def transformer(self, hidden: torch.Tensor, attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        # Only tensors go in: DeepSpeed's partitioned checkpointing miscounts a None argument.
        masks = () if attention_mask is None else (attention_mask,)
        for chunk, recomputed in self.layer_chunks():
            run = functools.partial(run_layers, chunk)
            hidden = self.checkpoint_layer(run, hidden, *masks) if recomputed else run(hidden, *masks)
        return hidden

    def head(self, hidden: torch.Tensor, labels: Optional[torch.Tensor] = None,
             loss_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        logits = self.lm_head(normalize(self.final_layernorm, hidden), self.embedding.word_embeddings.weight)
        return logits if labels is None else self.loss(logits, labels, loss_mask)
