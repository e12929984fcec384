"""A Hugging Face model directory as read: its config.json, the family whose adapter maps it
(megatron/families/registry.py), our model flags, and its weights under our names, shape-checked first, every
tensor accounted for, the output layer tied or not as its tensors say."""
import logging
import os
from dataclasses import dataclass
from typing import Dict, Iterator, Mapping, Tuple

import torch

from megatron.hf.files import CONFIG_FILE, open_weights, read_config_json
from megatron.config.model_config import ModelConfig
from megatron.errors import InputError
from megatron.families.adapter import HFAdapter
from megatron.families.registry import family_of_hf_config
from megatron.model.gpt import GPTConfig, GPTModel
from megatron.tokenizer.hf_tokenizer import TOKENIZER_FILE, HFTokenizer

_log = logging.getLogger(__name__)

MAX_VOCAB_SIZE = 1 << 31  # token ids are stored as int32 at most (data/indexed_dataset.py)

HEAD = "lm_head.weight"
# Buffers some transformers versions saved beside the parameters: GPT-2's causal mask, Llama's rotary frequencies.
_BUFFER_SUFFIXES = (".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq")

def model_config_from_hf(adapter: HFAdapter, config: Mapping[str, object], source: str) -> ModelConfig:
    """The model a config.json describes, read by its family's `adapter`."""
    return ModelConfig.from_flags(adapter.model_flags_from_hf(config, source), source)


@dataclass(frozen=True)
class HFModel:
    """A Hugging Face model directory as read: its config.json, adapter and model flags."""
    directory: str
    config: dict
    adapter: HFAdapter
    model_config: ModelConfig

    @property
    def vocab_size(self) -> int:
        return int(self.config["vocab_size"])

    def weights(self, config: GPTConfig) -> Mapping[str, torch.Tensor]:
        """The weights under our names for `config` (this model's gpt_config, its vocabulary rows zero-padded to
        config.vocab_size), converted when asked."""
        checked = ShapeCheckedWeights(open_weights(self.directory), self.expected_shapes(config),
                                      os.path.join(self.directory, CONFIG_FILE))
        return self.adapter.from_hf_state_dict(checked, config)

    def expected_shapes(self, config: GPTConfig) -> Dict[str, Tuple[int, ...]]:
        """Each Hugging Face tensor's shape as config.json gives it: the adapter's export of this model (`config`)
        built on the meta device (no memory), padded vocabulary rows dropped."""
        with torch.device("meta"):
            state = GPTModel(config).state_dict()
        return {name: tuple(tensor.shape) for name, tensor in self.adapter.to_hf_tensors(state, config,
                                                                                         self.vocab_size)}


class ShapeCheckedWeights(Mapping):
    """Hugging Face tensors whose shapes were checked, before any is read, against those config.json gives them:
    weights of another model are one line naming the tensor, not a shape error deep inside a conversion (and an
    embedding of another vocabulary is never padded)."""

    def __init__(self, weights: Mapping[str, torch.Tensor], expected: Mapping[str, Tuple[int, ...]], config_path: str):
        self._weights = weights
        self._config_path = config_path
        for name in weights:
            shape = expected.get(name, expected.get(f"transformer.{name}"))  # GPT2Model's names lack the prefix
            found = weights.shape(name) if hasattr(weights, "shape") else tuple(weights[name].shape)
            if shape is None and not name.endswith(_BUFFER_SUFFIXES) and name != HEAD:  # a tied head: equal
                raise InputError(f"the Hugging Face tensor '{name}' is not part of the model {config_path} "
                                 "describes (more layers, or other parts, than it has): the weights and config.json "
                                 "belong to different models; use the config.json saved with these weights")
            if shape is not None and tuple(found) != shape:
                raise InputError(f"the Hugging Face tensor '{name}' has shape {list(found)}, but {config_path} "
                                 f"describes {list(shape)}: the weights and config.json belong to different models; "
                                 "use the config.json saved with these weights")

    def __getitem__(self, name: str) -> torch.Tensor:
        tensor = self._weights[name]
        if not tensor.is_floating_point():
            raise InputError(f"the Hugging Face tensor '{name}' of {os.path.dirname(self._config_path)} holds "
                             f"{tensor.dtype} values; a model's weights are floating point (fp32, fp16, bf16): "
                             "these are not weights this import can use")
        if not bool(torch.isfinite(tensor).all()):
            raise InputError(f"the Hugging Face tensor '{name}' of {os.path.dirname(self._config_path)} holds NaN "
                             "or infinite values; the model is damaged: import an intact copy")
        return tensor

    def __contains__(self, name) -> bool:
        return name in self._weights

    def __iter__(self) -> Iterator[str]:
        return iter(self._weights)

    def __len__(self) -> int:
        return len(self._weights)


def read_hf_model(directory: str) -> HFModel:
    """Read `directory`'s config.json (which architecture, which model) and check the tokenizer beside it."""
    config = read_config_json(directory)
    path = os.path.join(directory, CONFIG_FILE)
    adapter = family_of_hf_config(config, path).adapter
    vocab_size = config.get("vocab_size")
    if not isinstance(vocab_size, int) or isinstance(vocab_size, bool) or not 1 <= vocab_size <= MAX_VOCAB_SIZE:
        raise InputError(f"{path} sets vocab_size={vocab_size!r}; it must be the whole number of rows of the "
                         f"model's word embedding, between 1 and {MAX_VOCAB_SIZE}")
    model_config_from_hf(adapter, config, path)  # config.json checked before any weights are opened
    config = tied_as_the_tensors_say(config, adapter, directory)
    check_tokenizer_fits(directory, vocab_size)
    return HFModel(directory, config, adapter, model_config_from_hf(adapter, config, path))


def check_tokenizer_fits(directory: str, vocab_size: int) -> None:
    """A tokenizer.json beside the model must give no id the embedding lacks a row for (fewer tokens than rows is
    a padded vocabulary, as DeepSeek-Coder's: fine)."""
    path = os.path.join(directory, TOKENIZER_FILE)
    tokens = HFTokenizer(directory).vocab_size if os.path.isfile(path) else 0
    if tokens > vocab_size:
        raise InputError(f"{path} has {tokens} tokens, more than the model's vocab_size {vocab_size} in its "
                         f"config.json: ids from {vocab_size} on would have no embedding row; put the tokenizer "
                         "saved with this model beside it")


def tied_as_the_tensors_say(config: dict, adapter: HFAdapter, directory: str) -> dict:
    """config.json with tie_word_embeddings as its tensors decide, as transformers does: a stored lm_head.weight
    equal to the word embedding is tied; a different one is the model's own head (a Llama then imports untied,
    said in one line; an adapter's ALWAYS_TIED architecture, as GPT2LMHeadModel, refuses it)."""
    if not config.get("tie_word_embeddings", adapter.ALWAYS_TIED):
        return config
    weights = open_weights(directory)
    if HEAD not in weights:
        return config
    embedding = next((name for name in (adapter.EMBEDDING, adapter.EMBEDDING.removeprefix("transformer."))
                      if name in weights), None)  # GPT2Model's names lack the prefix
    if embedding is None or torch.equal(weights[HEAD], weights[embedding]):
        return config
    if adapter.ALWAYS_TIED:
        raise InputError(f"{directory} stores an {HEAD} different from its word embedding, but a "
                         f"{adapter.ARCHITECTURE}'s head is the word embedding (tied): these weights are not a "
                         f"{adapter.ARCHITECTURE}'s")
    _log.info(f"{os.path.join(directory, CONFIG_FILE)} sets tie_word_embeddings, but the stored {HEAD} differs "
              "from the word embedding: imported untied, with its own output layer, as transformers loads it")
    return {**config, "tie_word_embeddings": False}
