"""Rotary scaling: each rule's frequencies and YaRN's cos / sin factor equal transformers' own rope init functions
(ROPE_INIT_FUNCTIONS, fp32), with parameters that reach every branch (llama3's three wavelength bands, YaRN's
ramp with and without truncation, its mscale pair and a given attention factor, a partial rotary head); the cos /
sin tables equal transformers' LlamaRotaryEmbedding at positions past the original context; unscaled is unchanged."""
import pytest
import torch

from megatron.families.rope_scaling import RopeScaling
from megatron.model.rotary import RotaryEmbedding

HEAD_DIM, THETA, ORIGINAL, LONGEST = 32, 10000.0, 16, 96

CASES = {
    "linear": (dict(factor=4.0), RopeScaling("linear", 4.0)),
    "llama3": (dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=64),
               RopeScaling("llama3", 8.0, 64)),
    "llama3 other bands": (dict(factor=3.0, low_freq_factor=2.0, high_freq_factor=8.0,
                                original_max_position_embeddings=64),
                           RopeScaling("llama3", 3.0, 64, low_freq_factor=2.0, high_freq_factor=8.0)),
    "yarn": (dict(factor=4.0, original_max_position_embeddings=ORIGINAL), RopeScaling("yarn", 4.0, ORIGINAL)),
    "yarn untruncated, betas": (dict(factor=6.0, original_max_position_embeddings=ORIGINAL, beta_fast=16.0,
                                     beta_slow=2.0, truncate=False),
                                RopeScaling("yarn", 6.0, ORIGINAL, beta_fast=16.0, beta_slow=2.0, truncate=False)),
    "yarn mscale pair": (dict(factor=40.0, original_max_position_embeddings=ORIGINAL, mscale=0.707,
                              mscale_all_dim=0.707 * 1.3),
                         RopeScaling("yarn", 40.0, ORIGINAL, mscale=0.707, mscale_all_dim=0.707 * 1.3)),
    "yarn attention factor": (dict(factor=4.0, original_max_position_embeddings=ORIGINAL, attention_factor=1.25),
                              RopeScaling("yarn", 4.0, ORIGINAL, attention_factor=1.25)),
}


def hf_config(kind: str, parameters: dict, partial: float = 1.0):
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=4 * HEAD_DIM, num_attention_heads=4, head_dim=HEAD_DIM, num_hidden_layers=1,
                       max_position_embeddings=LONGEST, partial_rotary_factor=partial,
                       rope_parameters={"rope_type": kind.split()[0], "rope_theta": THETA, **parameters})


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("partial", [1.0, 0.5])
def test_frequencies_and_cos_sin_scale_equal_transformers_rope_init(case, partial):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    parameters, scaling = CASES[case]
    expected, attention = ROPE_INIT_FUNCTIONS[case.split()[0]](hf_config(case, parameters, partial), "cpu")
    rotary = RotaryEmbedding.for_heads(HEAD_DIM, partial, THETA, scaling=scaling)
    ours = rotary.frequencies("cpu")
    assert ours.dtype == torch.float32 and ours.shape == expected.shape
    torch.testing.assert_close(ours, expected, rtol=1e-6, atol=0)
    assert rotary.scaling.cos_sin_scale == pytest.approx(attention, rel=1e-12)
    unscaled = RotaryEmbedding.for_heads(HEAD_DIM, partial, THETA).frequencies("cpu")
    assert not torch.allclose(ours, unscaled) or attention != 1.0  # the rule changed something


def test_llama3_keeps_short_waves_divides_long_ones_and_blends_between():
    base = RotaryEmbedding.for_heads(HEAD_DIM, 1.0, THETA).frequencies("cpu")
    scaled = CASES["llama3"][1].frequencies(base, THETA)  # original context 64: high band < 16, low band > 64
    wavelengths = 2 * torch.pi / base
    short, long = wavelengths < 64 / 4, wavelengths > 64
    assert short.any() and long.any() and (~short & ~long).any()  # all three bands in this head
    assert torch.equal(scaled[short], base[short]) and torch.equal(scaled[long], base[long] / 8)
    between = ~short & ~long
    assert ((scaled[between] < base[between]) & (scaled[between] > base[between] / 8)).all()


@pytest.mark.parametrize("case", ["llama3", "yarn mscale pair", "linear"])
def test_cos_sin_tables_equal_transformers_past_the_original_context(case):
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    parameters, scaling = CASES[case]
    reference = LlamaRotaryEmbedding(hf_config(case, parameters))
    heads = torch.ones(1, 1, LONGEST, HEAD_DIM)
    cos, sin = reference(heads, torch.arange(LONGEST)[None])
    rotary = RotaryEmbedding.for_heads(HEAD_DIM, 1.0, THETA, scaling=scaling)
    offset = 40  # as a KV cache continues past the original context
    angles = rotary.angles(torch.arange(offset, LONGEST)[None])[0]
    scale = rotary.scaling.cos_sin_scale
    torch.testing.assert_close(angles.cos() * scale, cos[0, offset:], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(angles.sin() * scale, sin[0, offset:], rtol=1e-5, atol=1e-6)
    query = torch.randn(2, 3, LONGEST, HEAD_DIM, generator=torch.Generator().manual_seed(0))
    rotated = rotary(query, torch.arange(LONGEST)[None])
    expected = query * cos[None] + torch.cat((-query[..., HEAD_DIM // 2:], query[..., :HEAD_DIM // 2]), -1) * sin[None]
    torch.testing.assert_close(rotated, expected, rtol=1e-5, atol=1e-5)


def test_unscaled_rotary_is_the_plain_rule():
    rotary = RotaryEmbedding.for_heads(HEAD_DIM, 1.0, THETA)
    assert rotary.scaling == RopeScaling() and rotary.scaling.cos_sin_scale == 1.0
    expected = THETA ** (-torch.arange(0, HEAD_DIM, 2, dtype=torch.float32) / HEAD_DIM)
    assert torch.equal(rotary.frequencies("cpu"), expected)
