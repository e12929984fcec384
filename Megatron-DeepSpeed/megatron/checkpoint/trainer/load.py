"""What --load restores into a built engine, as the resume plan (trainer/resume_plan.py) decided before it was
built: DeepSpeed's load of the checkpoint (through its universal loader where the plan says so), the client state's
iteration, consumed samples and random states, and the weights of a layout the engine cannot load, read by the
format readers (formats/reader.py) and copied into this rank's modules."""
import logging
import os
import pickle
import random
from typing import Any, Mapping, Optional

import numpy as np
import torch
from deepspeed.pipe import PipelineModule

from megatron import device
from megatron.checkpoint import trust
from megatron.checkpoint.client_state import recorded_consumed_samples, rng_states, tracker_states
from megatron.checkpoint.file_names import ITERATION, LANGUAGE_MODEL, optimizer_states_file
from megatron.checkpoint.formats.detect import Layout
from megatron.checkpoint.formats.checkpoint import Checkpoint
from megatron.checkpoint.formats.reader import read_checkpoint
from megatron.checkpoint.formats.weight_units import TensorShard
from megatron.checkpoint.parameter_names import expert_model_name, flatten, is_nested, nest
from megatron.checkpoint.torch_files import load_file
from megatron.checkpoint.trainer.resume_plan import EXPERT_SPLIT_FLAG, MOE_FLAGS, LoadOptions, ResumePlan, plan_resume
from megatron.config.job import JobConfig
from megatron.errors import InputError, RunError
from megatron.files.glob_free import glob_free
from megatron.tokenizer import vocab_size_with_padding

_log = logging.getLogger(__name__)


def _set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    device.accelerator().set_rng_state(state["device"])


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
    zero_partitions = parallel.data * parallel.ds_sequence_parallel_size  # ZeRO partitions over both
    run = Layout(tensor=parallel.tensor, pipeline=parallel.pipeline, data=zero_partitions,
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
    the master weights; DeepSpeed's ZeRO-0 path cannot load them (checkpoint/reshape/bf16_slices.py)."""
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
