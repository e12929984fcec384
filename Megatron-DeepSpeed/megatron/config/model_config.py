"""The model's flags: the one mapping between Megatron's command line (or the flags a checkpoint records) and the
model's configuration.

Every field is named as its flag's argparse destination and carries upstream's default, which a checkpoint
written before the flag existed was trained with. `from_flags` reads a field from a mapping of flags (the
parsed command line, a checkpoint's recorded flags, an imported model's); `to_flags` gives back exactly what a
checkpoint records. `architecture` marks the flags a resumed run must repeat (checkpoint/trainer/resume_plan.py).
Adding a model flag is one line here (plus, for the model to use it, the same-named field of model/gpt.py's
GPTConfig, which model/gpt_config.py fills from this one); a variant that is a plain on-switch declares its help
here too, and config/flags/model.py adds its flag from it.
"""
import numbers
import typing
from dataclasses import MISSING, dataclass, field, fields
from typing import Mapping, Optional

from megatron.errors import InputError


def _flag(default=MISSING, architecture: bool = False):
    """A model flag with upstream's `default` (none: every run gives it); `architecture`: the checkpoint's
    weights compute the model it was trained as only with the same value."""
    return field(default=default, metadata={"architecture": architecture})


def _variant(default, switch: str = ""):
    """An architecture variant (VARIANT_FLAGS) with GPT-2's `default`; `switch`: the help of its flag when that is
    a plain on-switch --the-field-name, which config/flags/model.py then adds from this declaration."""
    return field(default=default, metadata={"architecture": True, "variant": True, "switch": switch})


@dataclass(frozen=True)
class ModelConfig:
    """The architecture flags; with the padded vocabulary and the kernels they make a model/gpt.py GPTConfig."""
    num_layers: int = _flag(architecture=True)
    hidden_size: int = _flag(architecture=True)
    num_attention_heads: int = _flag(architecture=True)
    max_position_embeddings: int = _flag(architecture=True)
    ffn_hidden_size: Optional[int] = _flag(None, architecture=True)  # None: 4 x hidden_size
    openai_gelu: bool = _flag(False, architecture=True)  # GeLU's tanh form instead of the erf form
    layernorm_epsilon: float = _flag(1e-5, architecture=True)
    hidden_dropout: float = _flag(0.1)
    attention_dropout: float = _flag(0.1)
    init_method_std: float = _flag(0.02)
    init_method_xavier_uniform: bool = _flag(False)
    seed: int = _flag(1234)  # with the piece index, decides every initial weight
    checkpoint_activations: bool = _flag(False)
    checkpoint_num_layers: int = _flag(1)  # layers per recomputed chunk
    recompute_granularity: Optional[str] = _flag(None)  # upstream main's: None, "full" or "selective"
    recompute_method: Optional[str] = _flag(None)  # with "full": "uniform" or "block"
    recompute_num_layers: int = _flag(1)
    fp32_residual_connection: bool = _flag(False)
    masked_softmax_fusion: bool = _flag(True)  # False: Megatron's unfused attention, where the next two apply
    apply_query_key_layer_scaling: bool = _flag(True)
    attention_softmax_in_fp32: bool = _flag(False)
    torch_compile: bool = _flag(False)  # the model through torch.compile (model/provider.py)
    # Architecture variants (upstream main's flags; the defaults are GPT-2's, so older checkpoints read as it):
    normalization: str = _variant("layernorm")  # or "rmsnorm"
    add_position_embedding: bool = _variant(True)  # learned absolute positions
    use_rotary_position_embeddings: bool = _variant(False)
    rotary_percent: float = _variant(1.0)  # of each head's channels that rotate
    rope_theta: int = _variant(10000)  # the rotary base
    # Rotary scaling (families/rope_scaling.py): None, "llama3", "linear" or "yarn", and its parameters; None below
    # means the type's default (filled in by __post_init__).
    rope_scaling_type: Optional[str] = _variant(None)
    rope_scaling_factor: Optional[float] = _variant(None)  # llama3: 8 (Megatron-LM's)
    rope_scaling_low_freq_factor: float = _variant(1.0)  # llama3
    rope_scaling_high_freq_factor: float = _variant(4.0)  # llama3
    rope_scaling_original_max_position_embeddings: Optional[int] = _variant(None)  # the trained context
    yarn_beta_fast: float = _variant(32.0)
    yarn_beta_slow: float = _variant(1.0)
    yarn_mscale: float = _variant(1.0)
    yarn_mscale_all_dim: float = _variant(0.0)
    yarn_attention_factor: Optional[float] = _variant(None)  # None: from factor and mscales
    yarn_correction_range_round_to_int: bool = _variant(True)  # transformers' `truncate`
    # Sliding-window attention: the earlier keys each query sees besides itself (None: all; model/attention_spec.py)
    window_size: Optional[int] = _variant(None)
    swiglu: bool = _variant(False)  # SiLU-gated MLP; ffn_hidden_size is each branch's width
    num_key_value_heads: Optional[int] = _variant(None)  # None: num_attention_heads (no GQA)
    add_bias_linear: bool = _variant(True)
    untie_embeddings_and_output_weights: bool = _variant(False)
    add_qkv_bias: bool = _variant(False, switch="Biases on the query, key and value projections even under "
                                  "--disable-bias-linear, which the other linears follow (Qwen2).")
    kv_channels: Optional[int] = _variant(None)  # each head's size (None: hidden_size / num_attention_heads)
    qk_layernorm: bool = _variant(False, switch="Normalise each query and key head (over its --kv-channels, by "
                                  "--normalization, a weight shared by the heads) before the rotary embedding "
                                  "(Qwen3).")

    def __post_init__(self):
        if self.ffn_hidden_size is None:  # as upstream's validation fills it in
            object.__setattr__(self, "ffn_hidden_size", 4 * self.hidden_size)
        if self.num_key_value_heads is None:
            object.__setattr__(self, "num_key_value_heads", self.num_attention_heads)
        self._fill_rope_scaling_defaults()

    def _fill_rope_scaling_defaults(self) -> None:
        """Megatron-LM's defaults for a rotary scaling type's parameters left unset; a type without a default
        factor needs one."""
        kind = self.rope_scaling_type
        if kind is None:
            return
        if kind not in ROPE_SCALING_DEFAULTS:
            raise InputError(f"--rope-scaling-type {kind!r} is not one of {', '.join(ROPE_SCALING_DEFAULTS)}")
        factor, original = ROPE_SCALING_DEFAULTS[kind]
        if self.rope_scaling_factor is None and factor is None:
            raise InputError(f"--rope-scaling-type {kind} needs --rope-scaling-factor (how many times longer the "
                             "context becomes, e.g. 4)")
        for name, default in (("rope_scaling_factor", factor),
                              ("rope_scaling_original_max_position_embeddings", original)):
            if getattr(self, name) is None:
                object.__setattr__(self, name, default)
        if kind == "llama3" and self.rope_scaling_high_freq_factor <= self.rope_scaling_low_freq_factor:
            raise InputError(f"--rope-scaling-high-freq-factor {self.rope_scaling_high_freq_factor} must be above "
                             f"--rope-scaling-low-freq-factor {self.rope_scaling_low_freq_factor} (Llama 3.1: 4 and 1)")

    @classmethod
    def from_flags(cls, flags: Mapping[str, object], source: str = "the command line") -> "ModelConfig":
        """The model `flags` describe (a flag missing or None: upstream's default). `source` names where the
        flags come from, for the error a missing or mistyped value gets."""
        values = {}
        for spec in fields(cls):
            value = flags.get(spec.name)
            if value is not None:
                values[spec.name] = typed_flag(spec.type, spec.name, value, source)
            elif spec.default is MISSING:
                raise InputError(f"--{_dashed(spec.name)} is missing from {source}; the model cannot be built "
                                 "without it")
        return cls(**values)

    def to_flags(self) -> dict:
        """The flags, as a checkpoint records them."""
        return {spec.name: getattr(self, spec.name) for spec in fields(self)}

    def variant_names(self) -> list:
        """The names of the architecture-variant flags set away from GPT-2's (e.g. ['normalization', 'swiglu'])."""
        gpt2 = ModelConfig(self.num_layers, self.hidden_size, self.num_attention_heads, self.max_position_embeddings)
        return [name for name in VARIANT_FLAGS if getattr(self, name) != getattr(gpt2, name)]

    def variants(self) -> list:
        """The architecture-variant flags set away from GPT-2's (e.g. ['--swiglu True', '--normalization rmsnorm'])."""
        return [f"--{_dashed(name)} {getattr(self, name)}" for name in self.variant_names()]


# Each rotary scaling type's default (factor, original context): Megatron-LM's --rope-scaling-factor 8 and
# Llama 3.1's 8192 for llama3, its --yarn-original-max-position-embeddings 4096 for yarn; None: no default.
ROPE_SCALING_DEFAULTS = {"llama3": (8.0, 8192), "linear": (None, None), "yarn": (None, 4096)}
ARCHITECTURE_FLAGS = tuple(spec.name for spec in fields(ModelConfig) if spec.metadata["architecture"])
DEFAULTS = {spec.name: spec.default for spec in fields(ModelConfig) if spec.default is not MISSING}
# The fields that turn GPT-2 into a Llama-style model (docs/llama.md) or another family's.
VARIANT_FLAGS = tuple(spec.name for spec in fields(ModelConfig) if spec.metadata.get("variant"))
# Variants whose flag is a plain on-switch, added to the parser from this declaration: name -> help.
SWITCHES = {spec.name: spec.metadata["switch"] for spec in fields(ModelConfig) if spec.metadata.get("switch")}


def _dashed(name: str) -> str:
    return name.replace("_", "-")


def typed_flag(declared, flag: str, value, source: str):
    """`value` as the `declared` type of flag `flag` (bool, int, float or str, or Optional of one), or an InputError
    naming the flag and where the value came from; a value of another declared type (a tuple) is returned as is."""
    kinds = typing.get_args(declared) if typing.get_origin(declared) is typing.Union else (declared,)
    kind = next(arg for arg in kinds if arg is not type(None))
    if kind not in (bool, int, float, str):
        return value
    wrong = (not isinstance(value, str) if kind is str else
             not isinstance(value, (bool, int)) if kind is bool else
             isinstance(value, bool) or not isinstance(value, numbers.Real) or
             (kind is int and not float(value).is_integer()))
    if wrong:
        raise InputError(f"--{_dashed(flag)} is {value!r} in {source}; it must be {kind.__name__} (correct "
                         "or remove that value)")
    return kind(value)
