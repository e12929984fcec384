"""deepspeed_npu's RMSNorm, rotary and SwiGLU kernels against torch_npu's operators (stand-ins written from
op-plugin's schemas and documentation, npu_llama_kernels_stand_in.py): a Llama-style model built with them
computes the portable model's loss and gradients, Qwen3's per-head query/key norms included; a chip or a torch_npu
without them keeps the portable ones."""
import types

import pytest
import torch
from npu_fusion_attention_stand_in import NpuFusionAttentionStandIn
from npu_llama_kernels_stand_in import SCHEMAS, npu_rms_norm, npu_rotary_mul, npu_swiglu
from npu_schemas import schema_parameters, signature_parameters

from deepspeed_npu.fused_kernels import SwiGLU, npu_kernels
from megatron.model.gpt import GPTConfig, GPTModel
from megatron.model.kernels import PORTABLE_KERNELS, select_kernels

STAND_INS = {"npu_rms_norm": npu_rms_norm, "npu_rotary_mul": npu_rotary_mul, "npu_swiglu": npu_swiglu}


def torch_npu(*without):
    return types.SimpleNamespace(npu_fusion_attention=NpuFusionAttentionStandIn(),
                                 **{name: op for name, op in STAND_INS.items() if name not in without})


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_the_stand_ins_have_the_schemas_signatures(name):
    assert signature_parameters(STAND_INS[name]) == schema_parameters(SCHEMAS[name])


PACKED = dict(position_ids=torch.tensor([[0, 1, 2, 0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5, 0, 1]]),
              segment_ids=torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0, 1, 1]]))


def loss_and_gradients(kernels, rotary_percent, packed=False, **variant):
    config = GPTConfig(**variant, vocab_size=64, max_position_embeddings=16, num_layers=2, hidden_size=32,
                       num_attention_heads=4, num_key_value_heads=2, ffn_hidden_size=48, hidden_dropout=0.0,
                       attention_dropout=0.0, normalization="rmsnorm", add_position_embedding=False,
                       use_rotary_position_embeddings=True, rotary_percent=rotary_percent, swiglu=True,
                       add_bias_linear=False, untie_embeddings_and_output_weights=True, kernels=kernels)
    model = GPTModel(config)
    tokens = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(3))
    loss = model(tokens[:, :-1], labels=tokens[:, 1:], **(PACKED if packed else {}))
    loss.backward()
    return loss.detach(), {name: parameter.grad for name, parameter in model.named_parameters()}


@pytest.mark.parametrize("rotary_percent, packed", [(1.0, False), (0.5, False), (1.0, True)])
def test_a_llama_model_on_the_npu_kernels_computes_the_portable_loss_and_gradients(rotary_percent, packed):
    """Packed: documents with restarting positions, through the fusion attention's TND layout and BS1D rotary."""
    module = torch_npu()
    kernels = select_kernels("npu", npu_kernels(module, "Ascend910B3"))
    assert (kernels.rms_norm.kernel_name, kernels.rotary_mul.kernel_name, kernels.swiglu.kernel_name) == (
        "torch_npu.npu_rms_norm", "torch_npu.npu_rotary_mul", "torch_npu.npu_swiglu")
    expected_loss, expected = loss_and_gradients(PORTABLE_KERNELS, rotary_percent, packed)
    loss, gradients = loss_and_gradients(kernels, rotary_percent, packed)
    torch.testing.assert_close(loss, expected_loss, rtol=1e-5, atol=1e-6)
    for name, gradient in expected.items():
        torch.testing.assert_close(gradients[name], gradient, rtol=1e-4, atol=1e-6, msg=name)
    # grouped-query attention: the 2 key/value heads reach the fused attention as they are, not repeated to 4
    assert {call["key_heads"] for call in module.npu_fusion_attention.calls} == {2}


def test_qwen3_query_and_key_norms_run_on_npu_rms_norm_over_each_head():
    """Qwen3's per-head norms (--qk-layernorm, heads of 16 channels at hidden 32) are the kernels' RMSNorm too: the
    operator gets the [batch, heads, seq, head_dim] query and key as the model holds them (non-contiguous views of
    the projection, which op-plugin's page allows) with gamma [head_dim], so it normalises each head's last dim."""
    seen = []

    def recording(self, gamma, epsilon=1e-06):
        seen.append((tuple(self.shape), tuple(gamma.shape), self.is_contiguous()))
        return npu_rms_norm(self, gamma, epsilon)
    module = torch_npu()
    module.npu_rms_norm = recording
    kernels = select_kernels("npu", npu_kernels(module, "Ascend910B3"))
    qwen3 = dict(qk_layernorm=True, kv_channels=16)
    expected_loss, expected = loss_and_gradients(PORTABLE_KERNELS, 1.0, **qwen3)
    loss, gradients = loss_and_gradients(kernels, 1.0, **qwen3)
    torch.testing.assert_close(loss, expected_loss, rtol=1e-5, atol=1e-6)
    assert any(name.endswith("q_norm.weight") for name in expected)
    for name, gradient in expected.items():
        torch.testing.assert_close(gradients[name], gradient, rtol=1e-4, atol=1e-6, msg=name)
    per_head = [call for call in seen if call[1] == (16,)]
    # two layers, each normalising its 4 query heads and its 2 key/value heads of 8 tokens
    assert sorted(per_head) == 2 * [((2, 2, 8, 16), (16,), False)] + 2 * [((2, 4, 8, 16), (16,), False)]


def test_other_chips_and_builds_without_an_operator_keep_the_portable_kernels():
    other_chip = select_kernels("npu", npu_kernels(torch_npu(), "Ascend910_9391"))
    assert (other_chip.rms_norm, other_chip.rotary_mul, other_chip.swiglu) == (
        PORTABLE_KERNELS.rms_norm, PORTABLE_KERNELS.rotary_mul, PORTABLE_KERNELS.swiglu)
    without_swiglu = npu_kernels(torch_npu("npu_swiglu"), "Ascend910B3")
    assert without_swiglu.swiglu is None and without_swiglu.rms_norm is not None
    assert without_swiglu.description() == ("torch_npu fused attention for training, PyTorch SDPA for inference; "
                                            "torch_npu RMSNorm, rotary")


def test_the_kernels_activation_defers_hand_on_every_operator():
    """activate() names the chip only when the trainer asks (ChipKernels): what it hands on is npu_kernels' whole
    choice, the Llama operators included."""
    from deepspeed_npu.activation import ChipKernels
    module = torch_npu()
    module.npu = types.SimpleNamespace(get_device_name=lambda index=0: "Ascend910B3", current_device=lambda: 0)
    deferred = select_kernels("npu", ChipKernels(module))
    direct = select_kernels("npu", npu_kernels(module, "Ascend910B3"))
    assert (deferred.rms_norm.kernel_name, deferred.rotary_mul.kernel_name, deferred.swiglu.kernel_name) == (
        direct.rms_norm.kernel_name, direct.rotary_mul.kernel_name, direct.swiglu.kernel_name)


def test_rotary_reaches_the_operator_in_bsnd_with_1s1d_tables():
    """The model's query is a [batch, heads, seq, dim] view of its [batch, seq, heads, dim] projection: the
    operator gets that projection's own layout (BSND, 1S1D tables; op-plugin's npu_rotary_mul constraints) and the
    portable result comes back in the model's view."""
    from deepspeed_npu.fused_kernels import RotaryMul
    from megatron.model.kernels import rotate_half_mul
    seen = []

    def recording(x, r1, r2, rotary_mode="half", rotate=None):
        seen.append((tuple(x.shape), tuple(r1.shape)))
        return npu_rotary_mul(x, r1, r2, rotary_mode, rotate)
    generator = torch.Generator().manual_seed(4)
    projection = torch.randn(2, 5, 3, 8, generator=generator)  # [batch, seq, heads, dim]
    query = projection.transpose(1, 2)
    cos, sin = (torch.randn(1, 1, 5, 8, generator=generator) for _ in range(2))
    output = RotaryMul(recording)(query, cos, sin)
    torch.testing.assert_close(output, rotate_half_mul(query, cos, sin))
    assert seen == [((2, 5, 3, 8), (1, 5, 1, 8))]


def test_swiglu_reaches_the_operator_as_the_projection_made_it():
    """The MLP's dense_h_to_4h output is its rank's [gate_r; up_r] halves (upstream's order), which npu_swiglu
    halves along the last dim itself: the tensor goes in as it is, no view or copy (no halves of one element)."""
    calls = []

    def operator(tensor, dim=-1):
        calls.append((tensor, dim))
        return npu_swiglu(tensor, dim)

    swiglu = SwiGLU(operator)
    inner = torch.randn(2, 3, 8)
    gate, up = inner.chunk(2, dim=-1)
    torch.testing.assert_close(swiglu(inner), torch.nn.functional.silu(gate) * up)
    assert len(calls) == 1 and calls[0][0] is inner and calls[0][1] == -1
