"""Checkpoints in DeepSpeed's layout, plus the client state that makes resuming exact.

Layout under --save (Megatron-DeepSpeed's): `global_step{N}/` written by DeepSpeed, `latest` naming the
newest complete one, and `latest_checkpointed_iteration.txt`. DeepSpeed itself writes `latest` from rank 0
before the other ranks are known to have finished; here it is written only after every rank's files are
on disk (DeepSpeed's closing barrier), under a temporary name and then renamed, so `latest` never points
at a half-written checkpoint.
"""
import os
import random
from typing import Any, Mapping, Optional

import numpy as np
import torch

from megatron import device
from megatron.atomic_files import write_text_atomically
from megatron.errors import InputError

LATEST_TAG_FILE = "latest"
LATEST_ITERATION_FILE = "latest_checkpointed_iteration.txt"


def checkpoint_tag(iteration: int) -> str:
    return f"global_step{iteration}"


def _rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "device": device.accelerator().get_rng_state()}


def _set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    device.accelerator().set_rng_state(state["device"])


def save_checkpoint(engine, save_dir: str, flags: Mapping[str, Any], iteration: int, consumed_train_samples: int,
                    rng_tracker, padded_vocab_size: int) -> str:
    """Save through the DeepSpeed engine (collective: every rank calls it). Returns the checkpoint dir.
    `flags` (the job's flags as plain values) are recorded with the padded vocabulary size, so the
    checkpoint can be read without this code base."""
    import torch.distributed as dist

    tag = checkpoint_tag(iteration)
    client_state = {"iteration": iteration, "consumed_train_samples": consumed_train_samples,
                    "args": {**flags, "padded_vocab_size": padded_vocab_size}, "rng_state": _rng_state(),
                    "tensor_parallel_rng_state": rng_tracker.get_states()}
    try:
        os.makedirs(save_dir, exist_ok=True)
    except OSError as err:
        raise InputError(f"--save {save_dir}: cannot create the checkpoint directory ({err.strerror})") from err
    engine.save_checkpoint(save_dir, tag=tag, client_state=client_state, save_latest=False)
    if dist.get_rank() == 0:
        write_text_atomically(os.path.join(save_dir, LATEST_TAG_FILE), tag)
        write_text_atomically(os.path.join(save_dir, LATEST_ITERATION_FILE), str(iteration))
    dist.barrier()
    return os.path.join(save_dir, tag)


def load_checkpoint(engine, load_dir: Optional[str], rng_tracker) -> tuple[int, int]:
    """Resume from `load_dir` (--load) if it holds a checkpoint: returns (iteration, consumed train samples),
    or (0, 0) when there is nothing to load (a fresh run, as in Megatron)."""
    if not load_dir or not os.path.exists(os.path.join(load_dir, LATEST_TAG_FILE)):
        return 0, 0
    load_path, client_state = engine.load_checkpoint(load_dir, load_optimizer_states=True,
                                                     load_lr_scheduler_states=False)
    if load_path is None or not client_state or "iteration" not in client_state:
        raise InputError(f"--load {load_dir}: the checkpoint named in its '{LATEST_TAG_FILE}' file could not be "
                         f"read as a checkpoint of this trainer; point --load at a --save directory")
    _set_rng_state(client_state["rng_state"])
    rng_tracker.set_states(client_state["tensor_parallel_rng_state"])
    return client_state["iteration"], client_state["consumed_train_samples"]
