"""Rotary scaling: the frequency rules that stretch a rotary embedding trained on a shorter context (the "original"
context) to a longer one, as Hugging Face transformers defines them (`rope_parameters["rope_type"]`):

- linear (position interpolation): every frequency divided by `factor`.
- llama3 (Llama 3.1-3.3): wavelengths longer than original / low_freq_factor are divided by `factor`, those shorter
  than original / high_freq_factor kept, and those between blended linearly in original / wavelength.
- yarn (YaRN, Peng et al. 2023; Qwen2.5's and DeepSeek's long context): each frequency blends its interpolated
  (/ factor) and original value by a ramp over the channels that turn between beta_fast and beta_slow times
  within the original context (the ramp's ends rounded outwards unless `truncate` is off), and the cos / sin
  tables are multiplied by an attention factor (given, or 0.1 ln(factor) + 1 scaled by mscale / mscale_all_dim).

The rules depend only on the base frequencies, so they hold at any position and for any split of the sequence
(KV cache, Ulysses chunks). They cost no FLOPs beyond the unscaled embedding's.
"""
import math
from dataclasses import dataclass
from typing import Optional

import torch

KINDS = ("llama3", "linear", "yarn")
# The model flags (config/model_config.ModelConfig's fields) that describe a scaling rule.
ROPE_SCALING_FLAGS = ("rope_scaling_type", "rope_scaling_factor", "rope_scaling_low_freq_factor",
                      "rope_scaling_high_freq_factor", "rope_scaling_original_max_position_embeddings",
                      "yarn_beta_fast", "yarn_beta_slow", "yarn_mscale", "yarn_mscale_all_dim",
                      "yarn_attention_factor", "yarn_correction_range_round_to_int")


@dataclass(frozen=True)
class RopeScaling:
    kind: Optional[str] = None  # None: unscaled
    factor: Optional[float] = None
    original_max_position_embeddings: Optional[int] = None  # the context the base frequencies were trained on
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    mscale: float = 1.0  # yarn
    mscale_all_dim: float = 0.0  # yarn
    attention_factor: Optional[float] = None  # yarn; None: from factor, mscale and mscale_all_dim
    truncate: bool = True  # yarn: round the ramp's ends to whole channels

    def frequencies(self, base: torch.Tensor, theta: float) -> torch.Tensor:
        """The scaled frequencies of the unscaled `base` ones (fp32, theta^(-2i / dim), i < dim / 2)."""
        if self.kind is None:
            return base
        if self.kind == "linear":
            return base / self.factor
        if self.kind == "llama3":
            return self._llama3(base)
        return self._yarn(base, theta)

    @property
    def cos_sin_scale(self) -> float:
        """What the cos and sin tables are multiplied by (YaRN's attention factor; 1 for the others)."""
        if self.kind != "yarn":
            return 1.0
        if self.attention_factor is not None:
            return self.attention_factor
        return _yarn_mscale(self.factor, self.mscale) / _yarn_mscale(self.factor, self.mscale_all_dim)

    def _llama3(self, base: torch.Tensor) -> torch.Tensor:
        original = self.original_max_position_embeddings
        wavelengths = 2 * math.pi / base
        long_waves = wavelengths > original / self.low_freq_factor
        short_waves = wavelengths < original / self.high_freq_factor
        scaled = torch.where(long_waves, base / self.factor, base)
        blend = (original / wavelengths - self.low_freq_factor) / (self.high_freq_factor - self.low_freq_factor)
        blended = (1 - blend) * scaled / self.factor + blend * scaled
        return torch.where(~long_waves & ~short_waves, blended, scaled)

    def _yarn(self, base: torch.Tensor, theta: float) -> torch.Tensor:
        dim = 2 * base.numel()

        def channel_turning(turns: float) -> float:
            """The channel whose wave turns `turns` times within the original context."""
            return dim * math.log(self.original_max_position_embeddings / (turns * 2 * math.pi)) / (2 * math.log(theta))

        low, high = channel_turning(self.beta_fast), channel_turning(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001  # a ramp of zero width would divide by zero
        ramp = ((torch.arange(dim // 2, dtype=torch.float32, device=base.device) - low) / (high - low)).clamp(0, 1)
        kept = 1 - ramp  # the share of each channel's original (extrapolated) frequency
        return base / self.factor * (1 - kept) + base * kept


def _yarn_mscale(factor: float, mscale: float) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0
