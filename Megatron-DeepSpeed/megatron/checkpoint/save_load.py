"""Checkpoints in DeepSpeed's layout, plus the client state that makes resuming exact.

Layout under --save (Megatron-DeepSpeed's): `global_step{N}/` written by DeepSpeed, `latest` naming the
newest complete one, and `latest_checkpointed_iteration.txt` holding its N. DeepSpeed itself writes `latest`
from rank 0 before the other ranks are known to have finished; here it moves only after every rank's files
are written (DeepSpeed's closing barrier) and flushed to disk by every rank (so a power cut cannot leave
`latest` naming data still in the page cache).

Two files cannot be replaced in one step, so both pointer files are links through one: `latest` ->
`.latest/latest` and `latest_checkpointed_iteration.txt` -> `.latest/latest_checkpointed_iteration.txt`,
where `.latest` links to a small directory `.latest.global_stepN/` holding the two files. Publishing a
checkpoint renames one new `.latest` link over the old one: a reader of either file sees the previous
checkpoint or the new one, and the two files always name the same one.

A save that fails (full disk, read-only or vanished file system) removes its partial files, leaves `latest`
on the previous complete checkpoint, and raises a RunError saying which path failed, why, and how much space
a checkpoint needs.
"""
import logging
import os
import pickle
import random
import shutil
import tempfile
from contextlib import nullcontext, suppress
from typing import Any, Mapping, Optional

import numpy as np
import torch
from deepspeed.pipe import PipelineModule

from megatron import device
from megatron.checkpoint import trust
from megatron.checkpoint.client_state import (build_client_state, recorded_args, recorded_consumed_samples,
                                              rng_states, tracker_states, universal_info)
from megatron.checkpoint.directory import Layout, load_file, pipeline_engine_of
from megatron.checkpoint.guard import latest_tag
from megatron.checkpoint.layout import (LATEST_ITERATION_FILE, LATEST_TAG_FILE, OPTIMIZER_SAVED, POINTER_DIR_PREFIX,
                                        POINTER_LINK, ITERATION, LANGUAGE_MODEL, UNIVERSAL_CHECKPOINT_INFO,
                                        model_states_file, optimizer_states_file)
from megatron.checkpoint.manifest import write_manifest
from megatron.checkpoint.names import expert_model_name, flatten, is_nested, nest, parameter_names
from megatron.checkpoint.nested_module import nested_state_dict
from megatron.checkpoint.reader import Checkpoint, read_checkpoint
from megatron.checkpoint.weight_units import TensorShard
from megatron.checkpoint.resume import EXPERT_SPLIT_FLAG, MOE_FLAGS, LoadOptions, ResumePlan, plan_resume
from megatron.config.job import JobConfig
from megatron.config.model_config import ModelConfig
from megatron.errors import InputError, RunError
from megatron.files.atomic import write_atomically
from megatron.files.glob_free import glob_free
from megatron.files.storage import directory_bytes, fsync_directory, fsync_tree, megabytes, write_failure_cause
from megatron.tokenizer import vocab_size_with_padding

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


def _set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    device.accelerator().set_rng_state(state["device"])


def _replace_symlink(path: str, target: str) -> None:
    """Make `path` a link to `target`, atomically (a new link renamed over whatever was there)."""
    temporary = f"{path}.{os.getpid()}.tmp"
    if os.path.lexists(temporary):
        os.unlink(temporary)
    os.symlink(target, temporary)
    os.replace(temporary, path)


def publish_latest(save_dir: str, tag: str) -> None:
    """Point `latest` and `latest_checkpointed_iteration.txt` at checkpoint `tag`, together (module docstring)."""
    pointer_name = POINTER_DIR_PREFIX + tag
    staging = tempfile.mkdtemp(dir=save_dir, prefix=pointer_name + ".", suffix=".tmp")
    try:
        for name, text in ((LATEST_TAG_FILE, tag), (LATEST_ITERATION_FILE, tag.removeprefix("global_step"))):
            with open(os.path.join(staging, name), "w", encoding="utf-8") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
        os.chmod(staging, 0o755)
        fsync_directory(staging)
        shutil.rmtree(os.path.join(save_dir, pointer_name), ignore_errors=True)  # left by an interrupted publish
        os.rename(staging, os.path.join(save_dir, pointer_name))
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _replace_symlink(os.path.join(save_dir, POINTER_LINK), pointer_name)
    for name in (LATEST_TAG_FILE, LATEST_ITERATION_FILE):
        path, target = os.path.join(save_dir, name), os.path.join(POINTER_LINK, name)
        if not (os.path.islink(path) and os.readlink(path) == target):
            _replace_symlink(path, target)
    fsync_directory(save_dir)
    for name in os.listdir(save_dir):
        if name.startswith(POINTER_DIR_PREFIX) and name != pointer_name:
            shutil.rmtree(os.path.join(save_dir, name), ignore_errors=True)


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
                    save_optimizer: bool = True, save_rng: bool = True) -> str:
    """Save through the DeepSpeed engine (collective: every rank calls it). Returns the checkpoint dir.
    `flags` (the job's flags as plain values) are recorded with the padded and the tokenizer's vocabulary
    sizes, so the checkpoint can be read (and exported) without this code base. Without save_optimizer
    (--no-save-optim) the optimizer state DeepSpeed wrote is removed again; without save_rng (--no-save-rng)
    no random state is recorded (a resume then keeps its own seeding)."""
    import torch.distributed as dist

    tag = checkpoint_tag(iteration)
    step_dir = os.path.join(save_dir, tag)
    if latest_tag(save_dir) == tag:  # a run resumed at its last iteration: that state is already saved
        _log.info(f"checkpoint {tag} is already the latest in {save_dir}; not saving it again")
        return step_dir
    args = recorded_args(flags, consumed_train_samples, padded_vocab_size, tokenizer_vocab_size)
    pipeline_engine = pipeline_engine_of(flags)
    names = parameter_names(ModelConfig.from_flags(flags, "the run's flags"))
    info = universal_info(names, flags["num_layers"], pipeline_engine, tokenizer_vocab_size or padded_vocab_size,
                          padded_vocab_size)
    state = build_client_state(args, iteration, _rng_state() if save_rng else None,
                         rng_tracker.get_states() if save_rng else None, info)
    state[OPTIMIZER_SAVED] = save_optimizer
    if getattr(engine, "has_moe_layers", False):  # DeepSpeed writes its own for MoE and refuses ours
        del state[UNIVERSAL_CHECKPOINT_INFO]
    # upstream's nesting of the plain engine's module, written by each rank (ZeRO 3 saves no module)
    nesting = nested_state_dict(engine.module) if not pipeline_engine and flags["zero_stage"] < 3 else nullcontext()
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
    zero_stage = flags["zero_stage"]
    if zero_stage != 0:
        return
    for mp_rank in range(flags["tensor_model_parallel_size"] * flags["pipeline_model_parallel_size"]):
        path = os.path.join(tag_dir, model_states_file(mp_rank, zero_stage))
        state = {**load_file(path), "optimizer": None}
        write_atomically(path, lambda handle: torch.save(state, handle))


def load_module(src: Mapping[str, Any], dst: torch.nn.Module) -> None:
    """DeepSpeed's custom_load_fn for the plain engine: a `module` nested as upstream's (or flat, as earlier
    versions of this project wrote it) into GPTModel. An MoE model's experts arrive flat beside the nested dict:
    DeepSpeed merges them in from its expert files, under our names or upstream's longer ones."""
    if not is_nested(src):
        dst.load_state_dict(flatten(nest({expert_model_name(name): tensor for name, tensor in src.items()})))
        return
    experts = {expert_model_name(name): tensor for name, tensor in src.items() if name != LANGUAGE_MODEL}
    dst.load_state_dict({**flatten(src), **experts})


def load_options(config: JobConfig) -> LoadOptions:
    checkpoint = config.checkpoint
    # --skip-train evaluates the weights: it builds no optimizer, so it reads no optimizer state.
    no_load_optim = checkpoint.no_load_optim or config.logging.skip_train
    return LoadOptions(finetune=checkpoint.finetune, no_load_optim=no_load_optim,
                       no_load_rng=checkpoint.no_load_rng, override_lr_scheduler=checkpoint.override_lr_scheduler,
                       use_checkpoint_lr_scheduler=checkpoint.use_checkpoint_lr_scheduler,
                       reset_iteration=checkpoint.reset_iteration, universal=checkpoint.universal_checkpoint,
                       trust_checkpoint=checkpoint.trust_checkpoint, evaluation_only=config.logging.skip_train)


def plan_load(config: JobConfig) -> Optional[ResumePlan]:
    """What --load will restore (None: nothing to resume from), checked against this job's layout, model and
    loading flags before the engine is built."""
    parallel, precision = config.parallel, config.precision
    run = Layout(tensor=parallel.tensor, pipeline=parallel.pipeline, data=parallel.data,
                 zero_stage=parallel.zero_stage, pipeline_engine=parallel.pipeline_engine)
    model_flags = {**config.model.to_flags(), **{flag: config.flags[flag] for flag in (*MOE_FLAGS, EXPERT_SPLIT_FLAG)}}
    return plan_resume(config.checkpoint.load, run, load_options(config), precision.name,
                       model_flags, zero_stage_chosen=parallel.zero_stage_chosen)


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


def _load_bf16_slices(engine, tag_dir: str) -> None:
    """BF16_Optimizer's Adam state and master weights from this rank's bf16_zero_pp_rank file, handed to its own
    loader as the ZeRO path does (a list indexed by data-parallel rank: this rank's entry is the one read), with
    the master weights; DeepSpeed's ZeRO-0 path cannot load them (checkpoint/bf16_slices.py)."""
    import torch.distributed as dist
    dp_rank = dist.get_rank(group=engine.optimizer.dp_process_group)
    contents = load_file(os.path.join(tag_dir, optimizer_states_file(engine.checkpoint_mp_rank, dp_rank, True)),
                         mmap=False)  # torch keeps the loaded tensors as its state
    entries = [None] * dp_rank + [contents["optimizer_state_dict"]]
    engine.optimizer.load_state_dict(entries, load_optimizer_states=True, load_from_fp32_weights=True)


def _copy_weights_in(engine, load_dir: str, parallel_state) -> Checkpoint:
    """plan.foreign: this rank's shard of each weight its module holds, read one at a time (nothing else of the
    checkpoint: no other shard, stage or optimizer state) and copied into its module; the optimizer's master
    copies refreshed from them, as DeepSpeed does after a weights-only load."""
    shard = TensorShard(parallel_state.get_tensor_model_parallel_rank(),
                        parallel_state.get_tensor_model_parallel_world_size())
    checkpoint = read_checkpoint(load_dir, part=shard, streamed=True, optimizer=False)
    module = engine.module
    pipelined = isinstance(module, PipelineModule)
    for name, parameter in module.named_parameters():
        full_name = module.single_process_name(name) if pipelined else name
        parameter.copy_(checkpoint.model[full_name])
    if hasattr(engine.optimizer, "refresh_fp32_params"):
        engine.optimizer.refresh_fp32_params()
    return checkpoint


def load_checkpoint(engine, load_dir: Optional[str], rng_tracker, plan: Optional[ResumePlan],
                    parallel_state) -> tuple[int, int]:
    """Resume from `load_dir` (--load) as `plan` (of plan_load) says: returns (iteration, consumed train
    samples), or (0, 0) when there is nothing to load (a fresh run, as in Megatron) or when fine-tuning."""
    if plan is None:
        return 0, 0
    import torch.distributed as dist

    if plan.foreign:
        checkpoint = _copy_weights_in(engine, load_dir, parallel_state)
        _log.info(f"--load {load_dir}: weights of {checkpoint.layout.describe()} copied in; the optimizer starts "
                  "fresh")
        return (checkpoint.iteration, checkpoint.consumed_train_samples) if plan.restore_progress else (0, 0)
    pipelined = isinstance(engine.module, PipelineModule)  # its pieces load themselves from the layer files
    # Weights only: DeepSpeed's load_module_only. Its ZeRO-3 weights come from the universal files only when
    # load_optimizer_states is set (unset, it reads native ZeRO-3 partitions).
    try:
        with trust.trusting(plan.trusted), trust.deepspeed_loads(), glob_free(load_dir) as literal_load_dir:
            load_path, client_state = engine.load_checkpoint(
                literal_load_dir, tag=plan.tag, load_optimizer_states=(plan.load_optimizer or plan.universal)
                and not plan.bf16_slices, load_lr_scheduler_states=False, load_module_only=not plan.load_optimizer,
                custom_load_fn=None if pipelined else load_module)
            if plan.bf16_slices and load_path is not None:
                _load_bf16_slices(engine, os.path.join(load_dir, plan.tag))
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError) as err:
        if trust.is_refusal(err):
            raise trust.refusal(os.path.join(load_dir, plan.tag), trust.refused_type(err)) from None
        raise RunError(f"--load {load_dir}: loading checkpoint {plan.tag} failed ({type(err).__name__}: {err}); if "
                       f"a file of it is damaged, restore it or resume from an older checkpoint") from err
    if load_path is None or not client_state or ITERATION not in client_state:
        raise InputError(f"--load {load_dir}: checkpoint {plan.tag} could not be read as a checkpoint of this "
                         "trainer; point --load at a --save directory")
    if dist.get_rank() == 0:  # upstream's line: which checkpoint this run continues
        _log.info(f"  successfully loaded checkpoint from {load_dir} at iteration {client_state[ITERATION]} "
                  f"({os.path.join(load_dir, plan.tag)})")
    if plan.universal:
        _unshare_adam_steps(engine.optimizer)
    if plan.load_rng:
        _set_rng_state(rng_states(client_state))
        rng_tracker.set_states(tracker_states(client_state))
    if not plan.restore_progress:
        return 0, 0
    return client_state[ITERATION], recorded_consumed_samples(client_state)
