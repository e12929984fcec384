"""FLOPs of a GPT training iteration, and the device peaks that turn achieved FLOPs into MFU.

Megatron's count for one iteration of global batch B, sequence s, L layers, hidden h and (padded) vocabulary V:
    24 * f * B * s * L * h^2 * (1 + s / (6h) + V / (16 L h))
with f = 3 for forward + backward, for GPT-2's layer (attention projections 4h^2 and a 4h MLP 8h^2 parameters,
12h^2 in all). Other layers count their own matrix parameters in units of 12h^2 (LayerMatrices): grouped-query
attention's K/V projections 2h x (key/value heads x head size), an MLP of --ffn-hidden-size f 2hf, a SwiGLU MLP
3hf (Megatron-LM's count); a head size of its own (--kv-channels) makes the query and output projections and the
attention scores' s / (6h) term use heads x head size in place of h (Megatron-LM's query projection size). Under
activation recomputation the forward runs twice, and Megatron's logged "TFLOPs" then uses f = 4: the hardware's work, which is what upstream's logs show and what ours show too, so the two can be
compared line by line. MFU (model FLOPs utilisation, PaLM's definition) always uses
f = 3: recomputation is overhead, not useful work, so it may not raise MFU.

A sliding window (--window-size) changes nothing in the count: each query's scores and context count the whole
sequence, as Megatron-LM's count does (it has no window term) and as causal attention's are counted whole though
its kernels skip half the square. So TFLOPs and MFU stay comparable with upstream's and across window sizes; where
the sequence exceeds the window they are above a count of the window's keys per query (Mistral 7B's shape with
v0.1's 4096-key window: 13% above at 8192 tokens, 1.9x at 32768; equal at 4096 or less), and the planner's step
time, which divides the same count, is pessimistic there.

A mixture-of-experts model counts the work each token does (its active parameters): an MoE layer's MLP term is
that of the top-k experts a token is routed to, plus the dense MLP of PR-MoE; the gate's small product is left out,
as Megatron leaves out LayerNorms. Attention is 8h^2 of the 24h^2 per layer and token, the MLP 16h^2 (GPT-2's).

Peaks are dense (no sparsity) tensor-core figures from the vendors' data sheets, by the dtype a run trains in.
A device missing from the table (a CPU, an unknown chip) has no peak: its MFU is reported as "n/a".
"""
from dataclasses import dataclass
from typing import Optional

from megatron.config.job import MoEConfig

# (device-name substring, {training dtype: peak TFLOP/s per device}); the first substring found in the device's
# name wins, so more specific names come first. fp32 runs use the TF32 tensor-core peak where the chip has one.
_PEAK_TFLOPS = (
    ("H200", {"bf16": 989.4, "fp16": 989.4, "fp32": 494.7}),
    ("H100 PCIe", {"bf16": 756.0, "fp16": 756.0, "fp32": 378.0}),
    ("H100 NVL", {"bf16": 835.0, "fp16": 835.0, "fp32": 417.5}),
    ("H100", {"bf16": 989.4, "fp16": 989.4, "fp32": 494.7}),  # SXM
    ("H800", {"bf16": 989.4, "fp16": 989.4, "fp32": 494.7}),
    ("A100", {"bf16": 312.0, "fp16": 312.0, "fp32": 156.0}),
    ("A800", {"bf16": 312.0, "fp16": 312.0, "fp32": 156.0}),
    ("V100", {"fp16": 125.0, "fp32": 15.7}),  # no bf16, no TF32
    ("Ascend910B", {"bf16": 313.0, "fp16": 313.0}),  # Atlas 800T A2 class; 910B4 parts are lower
)


def flops_per_iteration(global_batch_size: int, seq_length: int, num_layers: int, hidden_size: int,
                        vocab_size: int, recompute: bool = False, moe: Optional[MoEConfig] = None,
                        layer: Optional["LayerMatrices"] = None) -> float:
    """Megatron's FLOPs of one training iteration; `recompute` counts the second forward pass (f = 4); with `moe`,
    the MLPs of the MoE layers count as many times as a token uses them (active parameters); `layer`: the
    layer's matrix sizes (None: GPT-2's, 4h^2 of attention and 8h^2 of MLP)."""
    passes = 4 if recompute else 3
    attention, mlp = (layer.attention, layer.mlp) if layer else (4.0 * hidden_size ** 2, 8.0 * hidden_size ** 2)
    queries = layer.query_size if layer else hidden_size  # the width attention's scores and context multiply over
    mlp_uses = sum(active_mlps(moe, number + 1) for number in range(num_layers)) if moe else num_layers
    layers = (num_layers * attention + mlp_uses * mlp) / (12.0 * hidden_size ** 2)  # GPT-2 layers
    return (24.0 * passes * global_batch_size * seq_length * hidden_size ** 2
            * (layers + num_layers * seq_length * queries / (6.0 * hidden_size ** 2)
               + vocab_size / (16.0 * hidden_size)))


@dataclass(frozen=True)
class LayerMatrices:
    """The matrix parameters of one transformer layer of `model`, by part (what its tokens multiply with).
    `model`: any description with ModelConfig's field names (config/model_config.py, model/gpt.py's GPTConfig,
    planning/shape.py's ModelShape), read, not restated."""
    model: object

    @classmethod
    def of(cls, model) -> "LayerMatrices":
        return cls(model)

    @property
    def query_size(self) -> float:
        """Heads x head size (--kv-channels, else h / heads): h unless the head size is given (Megatron-LM's
        query projection size)."""
        model = self.model
        return model.num_attention_heads * (model.kv_channels or model.hidden_size / model.num_attention_heads)

    @property
    def attention(self) -> float:
        """Query and output projections h x query size each, key and value projections h x (key/value heads x
        head size) each."""
        model = self.model
        key_value_heads = model.num_key_value_heads or model.num_attention_heads
        return 2.0 * (1.0 + key_value_heads / model.num_attention_heads) * self.query_size * model.hidden_size

    @property
    def mlp(self) -> float:
        ffn = self.model.ffn_hidden_size or 4 * self.model.hidden_size
        return (3.0 if self.model.swiglu else 2.0) * self.model.hidden_size * ffn


def active_mlps(moe: MoEConfig, layer_number: int) -> int:
    """MLPs a token runs through in 1-based layer `layer_number`: 1 in a dense layer; in an MoE layer its top-k
    experts, plus the dense MLP of PR-MoE (--mlp-type residual)."""
    if moe.experts_of_layer(layer_number) == 1:
        return 1
    return moe.topk + (moe.mlp_type == "residual")


def tflops_per_device(flops: float, seconds_per_iteration: float, world_size: int) -> float:
    """Achieved TFLOP/s of each device when `flops` of work take `seconds_per_iteration` on `world_size`."""
    return flops / (seconds_per_iteration * world_size * 1e12)


def peak_tflops(device_model: str, dtype: str) -> Optional[float]:
    """Dense peak TFLOP/s of one `device_model` (e.g. "NVIDIA H100 80GB HBM3") training in `dtype`
    ("bf16", "fp16" or "fp32"); None when unknown."""
    for name, peaks in _PEAK_TFLOPS:
        if name.lower() in device_model.lower():
            return peaks.get(dtype)
    return None


def model_flops_utilization(model_tflops: float, peak: Optional[float]) -> Optional[float]:
    """MFU as a fraction (0.45 = 45%) from the model TFLOP/s per device (f = 3); None without a peak."""
    return None if not peak else model_tflops / peak


def format_mfu(mfu: Optional[float]) -> str:
    """How logs and tables show MFU: '45.2%', or 'n/a' where the device's peak is unknown."""
    return "n/a" if mfu is None else f"{100.0 * mfu:.1f}%"
