"""The plain engine's `module` saved as upstream's GPTModel.state_dict_for_save_checkpoint nests it
(language_model -> embedding / encoder, checkpoint/parameter_names.nest) by every rank as DeepSpeed writes its file,
instead of rank 0 reading and rewriting each file afterwards.

DeepSpeed's engine saves `module.state_dict()`; for the length of a save the module carries a state-dict post
hook (torch's public `register_state_dict_post_hook`) that turns its flat names into the nested dict in place.
Only the module's own state_dict call is changed: DeepSpeed's MoE save asks each MoE layer for its state dict
(hooks of the layer, not of the model), and its expert parameters stay flat beside `language_model`, where
DeepSpeed finds and moves them to their expert files, as it did from the flat dict."""
import contextlib
from typing import Iterator

import torch

from megatron.checkpoint.file_names import EXPERT_KEY_PATTERN
from megatron.checkpoint.parameter_names import nest


def _nest_in_place(module: torch.nn.Module, state_dict: dict, prefix: str, local_metadata: dict) -> None:
    if prefix:  # asked for as a part of a larger module: its names are that module's business
        return
    flat = dict(state_dict)
    experts = {name: tensor for name, tensor in flat.items() if EXPERT_KEY_PATTERN.search(name)}
    state_dict.clear()
    state_dict.update(nest({name: tensor for name, tensor in flat.items() if name not in experts}))
    state_dict.update(experts)


@contextlib.contextmanager
def nested_state_dict(module: torch.nn.Module) -> Iterator[None]:
    """Within it, `module.state_dict()` is nested as upstream's GPTModel saves it."""
    handle = module.register_state_dict_post_hook(_nest_in_place)
    try:
        yield
    finally:
        handle.remove()
