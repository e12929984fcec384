"""The top-level keys DeepSpeed reads from its JSON, taken from the installed DeepSpeed itself, so that a
misspelled section (`"zero_optimisation"`) is an error instead of a run with that section's defaults.

DeepSpeed reads its top-level keys with dict lookups (an unknown one is ignored without a word) and checks
only the sections it hands to its pydantic models. The keys it can read are, in the modules that
deepspeed.runtime.config takes its readers from: their string constants (ZERO_OPTIMIZATION = "zero_optimization"
...), the fields of their pydantic config models (the monitor's "tensorboard", "wandb" ...), and the literal
keys of their `.get("...")` calls ("compile"). That set is a superset of the top-level keys (it also holds
nested keys and some values), so a key outside it is one DeepSpeed does not know.
"""
import ast
import difflib
import functools
import inspect
import types
from typing import FrozenSet, Mapping

from megatron.errors import InputError

OPT_OUT_FLAG = "--allow-unknown-deepspeed-keys"


@functools.lru_cache(maxsize=1)
def known_keys() -> FrozenSet[str]:
    """Every name DeepSpeed's config readers can look up (see the module docstring)."""
    from deepspeed.runtime import config
    from deepspeed.runtime.config_utils import DeepSpeedConfigModel

    keys = set()
    for module in _reader_modules(config):
        for name, value in vars(module).items():
            if name.isupper() and isinstance(value, str):
                keys.add(value)
            elif isinstance(value, type) and issubclass(value, DeepSpeedConfigModel):
                keys.update(name for name in value.model_fields)
                keys.update(field.alias for field in value.model_fields.values() if field.alias)
        keys.update(_literal_get_keys(module))
    return frozenset(keys)


def _reader_modules(config: types.ModuleType) -> set:
    """deepspeed.runtime.config and the DeepSpeed modules its names come from."""
    modules = {config}
    for value in vars(config).values():
        module = value if isinstance(value, types.ModuleType) else inspect.getmodule(value)
        if module is not None and module.__name__.startswith("deepspeed"):
            modules.add(module)
    return modules


def _literal_get_keys(module: types.ModuleType) -> set:
    try:
        tree = ast.parse(inspect.getsource(module))
    except (OSError, TypeError):  # no source (a compiled module): its constants and models still count
        return set()
    return {node.args[0].value for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
            and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)}


def check_top_level_keys(user: Mapping, path: str, also_known: FrozenSet[str] = frozenset()) -> None:
    """An InputError naming the first key of `user` (a --deepspeed_config JSON) that neither DeepSpeed reads nor
    `also_known` names (sections the trainer deals with itself)."""
    known = known_keys() | also_known
    for key in user:
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            meant = f"did you mean {close[0]!r}? " if close else ""
            raise InputError(f"--deepspeed_config {path}: DeepSpeed does not know the key {key!r} and would ignore "
                             f"it; {meant}fix the key, or pass {OPT_OUT_FLAG} to train with it ignored")
