"""A checkpoint is data: the types a checkpoint file may hold, and the rule that nothing else is unpickled.

Checkpoints are shared between teams and copied between clusters; a pickle can call any function it names, so
every file is read with torch.load(weights_only=True) and this allow-list: besides torch's own (tensors, plain
containers and numbers), the few types our checkpoints and upstream's hold: numpy arrays (numpy's RNG state),
argparse.Namespace (upstream's `args`), and DeepSpeed's optimizer bookkeeping (its loss scaler, the ZeRO stage
enum, the fragment addresses of ZeRO 1/2). A file that needs anything else is refused, naming the file and the
type. `--trust-checkpoint MODULE.NAME` (the `trusting` scope) adds the types a user names for an old or foreign
file; nothing is ever read with full pickle, so a file can only build what the list and the user allow.

DeepSpeed's own loads (`engine.load_checkpoint`, its universal-checkpoint loader) ask torch for full pickle;
`deepspeed_loads` makes them follow the same rule through torch's documented TORCH_FORCE_WEIGHTS_ONLY_LOAD
switch, for the duration of the load only.
"""
import argparse
import contextlib
import importlib
import os
import pickle
import re
from contextvars import ContextVar
from typing import Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch

from megatron.config.flags.checkpointing import TRUST_ARGUMENTS, TRUST_FLAG
from megatron.errors import InputError

_TRUSTED: ContextVar[Tuple[str, ...]] = ContextVar("trust_checkpoint", default=())
_FORCE_WEIGHTS_ONLY = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"  # torch.load's documented switch
_UNSUPPORTED = re.compile(r"(?:GLOBAL|global) ([\w.]+)")


def add_trust_flag(parser) -> None:
    """--trust-checkpoint on a checkpoint tool's command line (the trainer's is in config/flags)."""
    parser.add_argument(TRUST_FLAG, **TRUST_ARGUMENTS)


def allowed_globals() -> List[object]:
    """The types and functions (beyond torch's defaults) a checkpoint file may name."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    reconstruct = (np._core if hasattr(np, "_core") else np.core).multiarray._reconstruct  # numpy 2 / numpy 1
    dtypes = [type(np.dtype(name)) for name in ("uint32", "int64", "float32", "float64", "bool")]
    return [argparse.Namespace, np.ndarray, np.dtype, reconstruct, (reconstruct, "numpy.core.multiarray._reconstruct"),
            *dtypes, LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address,
            *(_named_global(name) for name in _TRUSTED.get())]


def _named_global(name: str) -> tuple:
    """The object `--trust-checkpoint MODULE.NAME` names (an installed module's attribute), as torch's allow-list
    takes it: with the name a pickle uses for it."""
    module, _, attribute = name.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attribute), name
    except (ImportError, AttributeError, ValueError):
        raise InputError(f"{TRUST_FLAG} {name}: no such type or function among the installed modules; give it "
                         "as the refusal names it (MODULE.NAME)") from None


@contextlib.contextmanager
def trusting(names: Optional[Sequence[str]]) -> Iterator[None]:
    """--trust-checkpoint: inside this scope checkpoint files may also hold the types `names` names."""
    token = _TRUSTED.set(tuple(names or ()))
    try:
        yield
    finally:
        _TRUSTED.reset(token)


def refused_type(error: BaseException) -> Optional[str]:
    """The type a weights-only UnpicklingError names (None: it names none, e.g. a pickle opcode)."""
    found = _UNSUPPORTED.search(str(error))
    return found.group(1) if found else None


def refusal(path: str, what: Optional[str]) -> InputError:
    """The one line for a file that names `what`, a type outside the allow-list (None: something else that is
    not plain data, which no flag admits)."""
    if what is None:
        return InputError(f"checkpoint file {path} holds pickled code, not plain data: it is refused as untrusted "
                          "code (loading it could run that code); save the weights as tensors and plain values")
    return InputError(f"checkpoint file {path} holds {what}, which a checkpoint may not hold (loading it could run "
                      f"code), so it is refused as untrusted code; if the file comes from a source you trust, pass "
                      f"{TRUST_FLAG} {what}")


def is_refusal(error: BaseException) -> bool:
    return isinstance(error, pickle.UnpicklingError) and "Weights only load failed" in str(error)


def torch_load(path: str, mmap: bool = True, meta: bool = False) -> object:
    """torch.load of one file on the CPU (with `meta`, its tensors on the meta device: no data read) under the
    rule (module docstring)."""
    with torch.serialization.safe_globals(allowed_globals()):
        return torch.load(path, map_location="meta" if meta else "cpu", weights_only=True, mmap=mmap and not meta)


def unsafe_type(path: str) -> Optional[str]:
    """The first type a zip-format torch file names outside the allow-list (None: none), read from its pickle
    alone (no tensor data): cheap enough to check every file of a checkpoint before any is loaded."""
    try:
        with torch.serialization.safe_globals(allowed_globals()):
            found = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except (ValueError, RuntimeError):  # not a zip-format torch file: its weights-only load still refuses
        return None
    return found[0] if found else None


@contextlib.contextmanager
def deepspeed_loads() -> Iterator[None]:
    """DeepSpeed's torch.load calls within this scope are weights-only with the allow-list (DeepSpeed 0.19.8 asks
    for full pickle; torch's switch overrides that)."""
    previous = os.environ.get(_FORCE_WEIGHTS_ONLY)
    os.environ[_FORCE_WEIGHTS_ONLY] = "1"
    try:
        with torch.serialization.safe_globals(allowed_globals()):
            yield
    finally:
        if previous is None:
            del os.environ[_FORCE_WEIGHTS_ONLY]
        else:
            os.environ[_FORCE_WEIGHTS_ONLY] = previous
