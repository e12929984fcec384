"""The trainer's save: checkpoints in DeepSpeed's layout, plus the client state that makes resuming exact
(trainer/load.py reads them back).

Layout under --save (Megatron-DeepSpeed's): `global_step{N}/` written by DeepSpeed, `latest` naming the
newest complete one, and `latest_checkpointed_iteration.txt` holding its N. DeepSpeed itself writes `latest`
from rank 0 before the other ranks are known to have finished; here it moves only after every rank's files
are written (DeepSpeed's closing barrier) and flushed to disk by every rank (so a power cut cannot leave
`latest` naming data still in the page cache).

Both pointer files are plain text files, as upstream's, so a copy of the directory (`cp -r run/* dst/`) and
DeepSpeed's own loader read them. Each is written to a temporary beside it and renamed over the old one, the
iteration file first and `latest` second, only once the checkpoint is complete: a kill at any moment leaves each
naming a complete checkpoint, and one between the two renames leaves the iteration file one checkpoint ahead of
`latest`, which every reader here follows (the next save writes both again). Directories saved when the two were
links through `.latest` -> `.latest.global_stepN/` still resume; their next save replaces the links with files
and removes the rest, with the temporaries a killed save left.

A save that fails (full disk, read-only or vanished file system) removes its partial files, leaves `latest`
on the previous complete checkpoint, and raises a RunError saying which path failed, why, and how much space
a checkpoint needs.
"""
import logging
import os
import random
import shutil
from contextlib import nullcontext, suppress
from typing import Any, Mapping, Optional

import numpy as np
import torch

from megatron import device
from megatron.checkpoint.client_state import build_client_state, recorded_args, universal_info
from megatron.checkpoint.file_names import (LATEST_ITERATION_FILE, LATEST_TAG_FILE, OLD_POINTER_DIR_PREFIX,
                                            OLD_POINTER_LINK, OPTIMIZER_SAVED, UNIVERSAL_CHECKPOINT_INFO,
                                            model_states_file)
from megatron.checkpoint.manifest import write_manifest
from megatron.checkpoint.parameter_names import parameter_names
from megatron.config.recorded_flags import RecordedFlags
from megatron.checkpoint.torch_files import load_file, replace
from megatron.checkpoint.trainer.guard import latest_tag
from megatron.checkpoint.trainer.nested_module import nested_state_dict
from megatron.config.model_config import ModelConfig
from megatron.errors import RunError
from megatron.files.atomic import write_text_atomically
from megatron.files.storage import directory_bytes, fsync_directory, fsync_tree, megabytes, write_failure_cause

_log = logging.getLogger(__name__)

BYTES_PER_PARAMETER = 16  # a first checkpoint's size: weights, fp32 master copy, Adam's two moments
# DeepSpeed copies these into every --save directory; they cannot read our checkpoints (pipeline files, tensor-
# parallel shards), and 0.19.8 has no switch to stop the copy, so they are removed after each save.
# tools/inspect_checkpoint.py and tools/convert_checkpoint.py replace them.
DEEPSPEED_RECOVERY_SCRIPTS = ("zero_to_fp32.py", "zero_to_torch.py")


def checkpoint_tag(iteration: int) -> str:
    return f"global_step{iteration}"


def _rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "device": device.accelerator().get_rng_state()}


def publish_latest(save_dir: str, tag: str) -> None:
    """Point `latest_checkpointed_iteration.txt`, then `latest`, at checkpoint `tag` (module docstring)."""
    write_text_atomically(os.path.join(save_dir, LATEST_ITERATION_FILE), tag.removeprefix("global_step"))
    write_text_atomically(os.path.join(save_dir, LATEST_TAG_FILE), tag)
    fsync_directory(save_dir)
    _remove_pointer_leftovers(save_dir)


def _remove_pointer_leftovers(save_dir: str) -> None:
    """The link layout's `.latest` and `.latest.global_stepN/`, and what a save killed while it wrote a pointer
    left (files/atomic.py's temporaries `.latest.*.tmp`, `.latest_checkpointed_iteration.txt.*.tmp`)."""
    for name in os.listdir(save_dir):
        path = os.path.join(save_dir, name)
        if not (name == OLD_POINTER_LINK or name.startswith(OLD_POINTER_DIR_PREFIX)
                or (name.startswith(f".{LATEST_ITERATION_FILE}.") and name.endswith(".tmp"))):
            continue
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.remove(path)


def _remove_recovery_scripts(save_dir: str) -> None:
    for script in DEEPSPEED_RECOVERY_SCRIPTS:
        with suppress(FileNotFoundError):
            os.remove(os.path.join(save_dir, script))


def _save_failure(save_dir: str, tag: str, error: BaseException, parameters_here: int) -> RunError:
    """Remove what the failed save of `tag` wrote, and say what happened."""
    shutil.rmtree(os.path.join(save_dir, tag), ignore_errors=True)
    _remove_recovery_scripts(save_dir)
    previous = latest_tag(save_dir)
    needed = (directory_bytes(os.path.join(save_dir, previous)) if previous
              else BYTES_PER_PARAMETER * parameters_here)
    cause = write_failure_cause(save_dir, error, needed)
    kept = (f"{os.path.join(save_dir, LATEST_TAG_FILE)} still names the complete {previous}" if previous
            else "no earlier checkpoint exists there")
    return RunError(f"saving checkpoint {tag} to {save_dir} failed: {cause}; a checkpoint takes about "
                    f"{megabytes(needed)}; its partial files were removed and {kept}; make room (or choose another "
                    f"--save) and resume with --load {save_dir}")


def save_checkpoint(engine, save_dir: str, flags: Mapping[str, Any], iteration: int, consumed_train_samples: int,
                    rng_tracker, padded_vocab_size: int, tokenizer_vocab_size: Optional[int] = None,
                    save_optimizer: bool = True, save_rng: bool = True,
                    consumed_train_tokens: Optional[int] = None) -> str:
    """Save through the DeepSpeed engine (collective: every rank calls it). Returns the checkpoint dir.
    `flags` (the job's flags as plain values) are recorded with the padded and the tokenizer's vocabulary
    sizes, so the checkpoint can be read (and exported) without this code base. Without save_optimizer
    (--no-save-optim) the optimizer state DeepSpeed wrote is removed again; without save_rng (--no-save-rng)
    no random state is recorded (a resume then keeps its own seeding). `consumed_train_tokens` (default: samples x
    --seq-length) is recorded as upstream's `tokens`."""
    import torch.distributed as dist

    tag = checkpoint_tag(iteration)
    step_dir = os.path.join(save_dir, tag)
    if latest_tag(save_dir) == tag:  # a run resumed at its last iteration: that state is already saved
        _log.info(f"checkpoint {tag} is already the latest in {save_dir}; not saving it again")
        return step_dir
    args = recorded_args(flags, consumed_train_samples, padded_vocab_size, tokenizer_vocab_size)
    run = RecordedFlags.of(flags)
    pipeline_engine = run.pipeline_engine
    names = parameter_names(ModelConfig.from_flags(flags, "the run's flags"))
    info = universal_info(names, run.num_layers, pipeline_engine, tokenizer_vocab_size or padded_vocab_size,
                          padded_vocab_size, swiglu=bool(flags.get("swiglu")))
    state = build_client_state(args, iteration, _rng_state() if save_rng else None,
                               rng_tracker.get_states() if save_rng else None, info, consumed_train_tokens)
    state[OPTIMIZER_SAVED] = save_optimizer
    if getattr(engine, "has_moe_layers", False):  # DeepSpeed writes its own for MoE and refuses ours
        del state[UNIVERSAL_CHECKPOINT_INFO]
    # upstream's nesting of the plain engine's module, written by each rank (ZeRO 3 saves no module)
    nesting = nested_state_dict(engine.module) if not pipeline_engine and run.zero_stage < 3 else nullcontext()
    try:
        with nesting:
            engine.save_checkpoint(save_dir, tag=tag, client_state=state, save_latest=False)
        dist.barrier()  # every model-states file written
        if dist.get_rank() == 0:
            _remove_recovery_scripts(save_dir)
            if not save_optimizer:
                _drop_optimizer_state(step_dir, flags)
        dist.barrier()  # no rank flushes a file that rank 0 is still replacing
        fsync_tree(step_dir)
    except (OSError, RuntimeError) as err:
        raise _save_failure(save_dir, tag, err, sum(p.numel() for p in engine.module.parameters())) from err
    dist.barrier()
    if dist.get_rank() == 0:
        try:
            write_manifest(step_dir)  # every rank's files are complete and on disk
            publish_latest(save_dir, tag)
        except OSError as err:
            raise _save_failure(save_dir, tag, err, 0) from err
    dist.barrier()
    return step_dir


def _drop_optimizer_state(tag_dir: str, flags: Mapping[str, Any]) -> None:
    """--no-save-optim: remove what DeepSpeed saved of the optimizer (its ZeRO partitions; under ZeRO 0 the
    state inside each model-states file, which is rewritten without it)."""
    for name in os.listdir(tag_dir):
        if name.endswith("_optim_states.pt"):
            os.remove(os.path.join(tag_dir, name))
    run = RecordedFlags.of(flags)
    if run.zero_stage != 0:
        return
    for mp_rank in range(run.model_parallel_ranks):
        path = os.path.join(tag_dir, model_states_file(mp_rank, 0))
        state = {**load_file(path), "optimizer": None}
        replace(path, state)
