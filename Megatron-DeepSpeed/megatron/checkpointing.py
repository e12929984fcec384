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
from megatron.checkpoint.reader import OPTIMIZER_SAVED, Layout, model_states_file
from megatron.checkpoint.resume import MODEL_FLAGS, LoadOptions, ResumePlan, plan_resume
from megatron.config import JobConfig
from megatron.errors import InputError
from megatron.tokenizer import vocab_size_with_padding

LATEST_TAG_FILE = "latest"
LATEST_ITERATION_FILE = "latest_checkpointed_iteration.txt"
# DeepSpeed copies these into every --save directory; they cannot read our checkpoints (pipeline files, tensor-
# parallel shards), and 0.19.8 has no switch to stop the copy, so they are removed after each save.
# tools/inspect_checkpoint.py and tools/convert_checkpoint.py replace them.
DEEPSPEED_RECOVERY_SCRIPTS = ("zero_to_fp32.py", "zero_to_torch.py")


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
                    rng_tracker, padded_vocab_size: int, tokenizer_vocab_size: Optional[int] = None,
                    save_optimizer: bool = True, save_rng: bool = True) -> str:
    """Save through the DeepSpeed engine (collective: every rank calls it). Returns the checkpoint dir.
    `flags` (the job's flags as plain values) are recorded with the padded and the tokenizer's vocabulary
    sizes, so the checkpoint can be read (and exported) without this code base. Without save_optimizer
    (--no-save-optim) the optimizer state DeepSpeed wrote is removed again; without save_rng (--no-save-rng)
    no random state is recorded (a resume then keeps its own seeding)."""
    import torch.distributed as dist

    tag = checkpoint_tag(iteration)
    client_state = {"iteration": iteration, "consumed_train_samples": consumed_train_samples,
                    "args": {**flags, "padded_vocab_size": padded_vocab_size,
                             "tokenizer_vocab_size": tokenizer_vocab_size},
                    OPTIMIZER_SAVED: save_optimizer}
    if save_rng:
        client_state.update(rng_state=_rng_state(), tensor_parallel_rng_state=rng_tracker.get_states())
    try:
        os.makedirs(save_dir, exist_ok=True)
    except OSError as err:
        raise InputError(f"--save {save_dir}: cannot create the checkpoint directory ({err.strerror})") from err
    engine.save_checkpoint(save_dir, tag=tag, client_state=client_state, save_latest=False)
    if dist.get_rank() == 0:
        for script in DEEPSPEED_RECOVERY_SCRIPTS:
            if os.path.isfile(os.path.join(save_dir, script)):
                os.remove(os.path.join(save_dir, script))
        if not save_optimizer:
            _remove_optimizer_state(os.path.join(save_dir, tag), flags)
        write_text_atomically(os.path.join(save_dir, LATEST_TAG_FILE), tag)
        write_text_atomically(os.path.join(save_dir, LATEST_ITERATION_FILE), str(iteration))
    dist.barrier()
    return os.path.join(save_dir, tag)


def _remove_optimizer_state(tag_dir: str, flags: Mapping[str, Any]) -> None:
    """--no-save-optim: drop what DeepSpeed saved of the optimizer (its ZeRO partitions; under ZeRO 0 the state
    inside each model-states file)."""
    for name in os.listdir(tag_dir):
        if name.endswith("_optim_states.pt"):
            os.remove(os.path.join(tag_dir, name))
    if flags["zero_stage"] == 0:
        for mp_rank in range(flags["tensor_model_parallel_size"] * flags["pipeline_model_parallel_size"]):
            path = os.path.join(tag_dir, model_states_file(mp_rank, 0))
            state = torch.load(path, map_location="cpu", weights_only=False)
            state["optimizer"] = None
            torch.save(state, path + ".tmp")
            os.replace(path + ".tmp", path)


def load_options(config: JobConfig) -> LoadOptions:
    checkpoint = config.checkpoint
    return LoadOptions(finetune=checkpoint.finetune, no_load_optim=checkpoint.no_load_optim,
                       no_load_rng=checkpoint.no_load_rng, override_lr_scheduler=checkpoint.override_lr_scheduler,
                       use_checkpoint_lr_scheduler=checkpoint.use_checkpoint_lr_scheduler,
                       reset_iteration=checkpoint.reset_iteration)


def plan_load(config: JobConfig) -> Optional[ResumePlan]:
    """What --load will restore (None: nothing to resume from), checked against this job's layout, model and
    loading flags before the engine is built."""
    parallel, precision = config.parallel, config.precision
    run = Layout(tensor=parallel.tensor, pipeline=parallel.pipeline, data=parallel.data,
                 zero_stage=parallel.zero_stage, pipeline_engine=parallel.pipeline_engine)
    model_flags = {flag: getattr(config.model, flag) for flag in MODEL_FLAGS}
    return plan_resume(config.checkpoint.load, run, load_options(config), precision.fp16 or precision.bf16,
                       model_flags)


def padded_vocab_size(tokenizer_vocab_size: int, make_vocab_size_divisible_by: int, tensor_parallel_size: int,
                      plan: Optional[ResumePlan], load_dir: Optional[str]) -> int:
    """Megatron's padding of the vocabulary, unless --load records the padded size its weights have: a reshaped
    or imported checkpoint keeps the size it was written with, whatever the tensor-parallel size now."""
    if plan is None or plan.padded_vocab_size is None:
        return vocab_size_with_padding(tokenizer_vocab_size, make_vocab_size_divisible_by, tensor_parallel_size)
    if plan.padded_vocab_size < tokenizer_vocab_size or plan.padded_vocab_size % tensor_parallel_size:
        raise InputError(f"--load {load_dir} holds a vocabulary of {plan.padded_vocab_size} rows, which does not fit "
                         f"this tokenizer's {tokenizer_vocab_size} entries split over --tensor-model-parallel-size "
                         f"{tensor_parallel_size}; check --tokenizer-type / --vocab-file, or reshape the checkpoint")
    return plan.padded_vocab_size


def _unshare_adam_steps(zero_optimizer) -> None:
    """DeepSpeed 0.19.8's ZeRO-3 universal loader hands every parameter group one and the same `step` tensor;
    torch's AdamW increments it in place once per group, so each step would count several times. Give each
    group its own copy."""
    state = getattr(getattr(zero_optimizer, "optimizer", None), "state", {})
    for parameter_state in state.values():
        if torch.is_tensor(parameter_state.get("step")):
            parameter_state["step"] = parameter_state["step"].clone()


def load_checkpoint(engine, load_dir: Optional[str], rng_tracker, plan: Optional[ResumePlan]) -> tuple[int, int]:
    """Resume from `load_dir` (--load) as `plan` (of plan_load) says: returns (iteration, consumed train
    samples), or (0, 0) when there is nothing to load (a fresh run, as in Megatron) or when fine-tuning."""
    if plan is None:
        return 0, 0
    # Weights only: DeepSpeed's load_module_only. Its ZeRO-3 weights come from the universal files only when
    # load_optimizer_states is set (unset, it reads native ZeRO-3 partitions).
    load_path, client_state = engine.load_checkpoint(load_dir, tag=plan.tag,
                                                     load_optimizer_states=plan.load_optimizer or plan.universal,
                                                     load_lr_scheduler_states=False,
                                                     load_module_only=not plan.load_optimizer)
    if load_path is None or not client_state or "iteration" not in client_state:
        raise InputError(f"--load {load_dir}: checkpoint {plan.tag} could not be read as a checkpoint of this "
                         "trainer; point --load at a --save directory")
    if plan.universal:
        _unshare_adam_steps(engine.optimizer)
    if plan.load_rng:
        _set_rng_state(client_state["rng_state"])
        rng_tracker.set_states(client_state["tensor_parallel_rng_state"])
    if not plan.restore_progress:
        return 0, 0
    return client_state["iteration"], client_state["consumed_train_samples"]
