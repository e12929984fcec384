"""Megatron's FLOPs formula, the device peak table and MFU (megatron/training/flops.py)."""
import pytest

from megatron.config.model_config import ModelConfig
from megatron.training.flops import (LayerMatrices, flops_per_iteration, format_mfu, model_flops_utilization,
                                     peak_tflops, tflops_per_device)

SHAPE_345M = dict(global_batch_size=16, seq_length=1024, num_layers=24, hidden_size=1024, vocab_size=50304)


def test_345m_iteration_flops_with_and_without_recompute():
    # 24*4*16*1024*24*1024^2 = 39582418599936 flops of matmuls; the attention and logit terms add 1/6 and
    # 50304/393216 of that: 51243254808576 flops per iteration with recompute (4 passes), 3/4 of it without.
    assert flops_per_iteration(**SHAPE_345M, recompute=True) == pytest.approx(51243254808576)
    assert flops_per_iteration(**SHAPE_345M) == pytest.approx(51243254808576 * 3 / 4)
    assert tflops_per_device(51243254808576, 2.0, 8) == pytest.approx(3.202703425536)


def test_tiny_shape_by_hand():
    # 24*3*1*2*1*1*(1 + 2/6 + 12/16) = 144 * 25/12 = 300 flops in 1e-10 s on one device.
    assert tflops_per_device(flops_per_iteration(1, 2, 1, 1, 12), 1e-10, 1) == pytest.approx(3.0)


def test_a_head_size_of_its_own_counts_in_the_projections_and_the_attention_scores():
    # Qwen3-0.6B's shape: 16 heads of 128 at hidden 1024 (query size 2048), 8 key/value heads, SwiGLU 3072.
    model = ModelConfig(num_layers=28, hidden_size=1024, num_attention_heads=16, max_position_embeddings=4096,
                        num_key_value_heads=8, kv_channels=128, swiglu=True, ffn_hidden_size=3072)
    layer = LayerMatrices.of(model)
    assert (layer.query_size, layer.attention, layer.mlp) == (2048, 6 * 1024 * 1024, 3 * 1024 * 3072)
    shape = dict(global_batch_size=1, seq_length=4096, num_layers=28, hidden_size=1024, vocab_size=151936)
    # 24 * 3 * s * h^2 per layer-unit: projections and MLP (15h^2 / 12h^2), scores 2s/(6h), logits V/(16h)
    expected = 24 * 3 * 4096 * 1024 ** 2 * (28 * 15 / 12 + 28 * 4096 * 2 / (6 * 1024) + 151936 / (16 * 1024))
    assert flops_per_iteration(**shape, layer=layer) == pytest.approx(expected)


def test_a_sliding_window_counts_the_whole_sequence_as_megatron_does():
    """The decision of flops.py: attention's scores count every key, window or not, so a windowed model's TFLOPs and
    MFU compare with upstream's; the windowless figure is the one to match."""
    shape = dict(num_layers=32, hidden_size=4096, num_attention_heads=32, max_position_embeddings=32768,
                 num_key_value_heads=8, swiglu=True, ffn_hidden_size=14336)
    windowless, windowed = (ModelConfig(**shape, window_size=window) for window in (None, 4095))
    iteration = dict(global_batch_size=1, seq_length=32768, num_layers=32, hidden_size=4096, vocab_size=32768)
    assert flops_per_iteration(**iteration, layer=LayerMatrices.of(windowed)) == flops_per_iteration(
        **iteration, layer=LayerMatrices.of(windowless))


@pytest.mark.parametrize("device, dtype, peak", [
    ("NVIDIA H100 80GB HBM3", "bf16", 989.4), ("NVIDIA H100 PCIe", "bf16", 756.0),
    ("NVIDIA H200", "fp16", 989.4), ("NVIDIA A100-SXM4-80GB", "fp32", 156.0),
    ("Tesla V100-SXM2-32GB", "fp16", 125.0), ("Tesla V100-SXM2-32GB", "bf16", None),
    ("Ascend910B3", "bf16", 313.0), ("cpu", "fp32", None), ("NVIDIA GeForce RTX 4090", "bf16", None)])
def test_peak_table(device, dtype, peak):
    assert peak_tflops(device, dtype) == peak


def test_mfu_and_its_display():
    assert model_flops_utilization(494.7, 989.4) == pytest.approx(0.5)
    assert model_flops_utilization(1.0, None) is None
    assert format_mfu(0.45) == "45.0%" and format_mfu(None) == "n/a"
