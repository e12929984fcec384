"""The one contract every family's Hugging Face adapter keeps (a module implementing HFAdapter; a test holds each
adapter's functions to these signatures), and what an adapter may read of our model description."""
from typing import Iterator, Mapping, Optional, Protocol, Tuple, runtime_checkable

import torch


class ModelFlags(Protocol):
    """What an adapter reads of config/model_config.ModelConfig: its fields by name, and these."""

    def to_flags(self) -> dict: ...

    def variant_names(self) -> list: ...

    def variants(self) -> list: ...


class BuiltModel(Protocol):
    """What an adapter reads of model/gpt.py's GPTConfig (vocab_size is the padded vocabulary)."""
    vocab_size: int
    num_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    add_bias_linear: bool
    untie_embeddings_and_output_weights: bool


@runtime_checkable
class HFAdapter(Protocol):
    """A transformers architecture <-> the single-process GPTModel's state dict and model flags."""
    MODEL_TYPE: str  # config.json's model_type
    ARCHITECTURE: str  # config.json's architectures entry (the transformers class)
    EMBEDDING: str  # the word embedding's tensor name (an lm_head equal to it is tied)
    ALWAYS_TIED: bool  # the head is the word embedding by definition: a different stored lm_head is refused

    def holds(self, model: ModelFlags) -> bool:
        """Whether this architecture can hold `model` (an export picks the first family that does)."""

    def model_flags_from_hf(self, config: Mapping[str, object], source: str) -> dict:
        """The model flags of a config.json (InputError, naming `source`, for what our model does not compute)."""

    def hf_config(self, model: ModelFlags, vocab_size: int, dtype: torch.dtype,
                  special_tokens: Optional[Mapping[str, object]] = None) -> dict:
        """config.json of the transformers model equal to `model`."""

    def from_hf_state_dict(self, hf: Mapping[str, torch.Tensor], config: BuiltModel) -> Mapping[str, torch.Tensor]:
        """Our tensors by name, each converted from `hf` when asked."""

    def to_hf_tensors(self, model: Mapping[str, torch.Tensor], config: BuiltModel,
                      vocab_size: int) -> Iterator[Tuple[str, torch.Tensor]]:
        """Their tensors by name, one at a time in model order, padded vocabulary rows dropped."""

    def describe(self, config: Mapping[str, object]) -> list:
        """What an examiner shows of a config.json beyond its shape, one line each."""
