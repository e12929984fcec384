"""Reshaping, as tools/convert_checkpoint.py offers it: a checkpoint written into another tensor / pipeline /
expert-parallel layout, its whole output directory atomically (Hugging Face export and import: hf/)."""
import os
from typing import Optional

from megatron.checkpoint.formats.detect import read_client_state
from megatron.checkpoint.torch_files import load_file
from megatron.checkpoint.formats.optimizer_state import read_optimizer_state
from megatron.checkpoint.client_state import rng_states, tracker_states
from megatron.checkpoint.file_names import model_parallel_rank, model_states_file
from megatron.checkpoint.formats.checkpoint import Checkpoint
from megatron.checkpoint.formats.reader import read_checkpoint
from megatron.checkpoint.formats.weight_units import Progress, quiet
from megatron.checkpoint.reshape.target_writer import TargetLayout, TrainingState, check_target, write_checkpoint
from megatron.errors import InputError
from megatron.files.atomic import check_output_directory, write_directory_atomically
from megatron.model.gpt_config import gpt_config

def training_state(checkpoint: Checkpoint) -> TrainingState:
    """Iteration, consumed samples, flags and RNG states of `checkpoint` (its tensor-parallel random streams
    per rank, from the first pipeline stage's files). The model flags are recorded in full, those an older
    checkpoint lacks at upstream's defaults."""
    first = read_client_state(checkpoint.directory, verify=False)  # read_checkpoint verified it
    per_rank = []
    if tracker_states(first) is not None and not checkpoint.layout.megatron:
        layout = checkpoint.layout
        zero_stage = 3 if layout.zero_stage == 3 else 0
        for tp in range(layout.tensor):
            state = first if tp == 0 else load_file(os.path.join(
                checkpoint.directory, model_states_file(model_parallel_rank(0, tp, layout.tensor), zero_stage)))
            per_rank.append(tracker_states(state))
    return TrainingState(iteration=checkpoint.iteration, consumed_train_samples=checkpoint.consumed_train_samples,
                         args={**checkpoint.args, **checkpoint.model_config.to_flags()},
                         rng_state=rng_states(first) if per_rank else None, tensor_parallel_rng_states=tuple(per_rank))


def reshape(load_dir: str, save_dir: str, target: TargetLayout, iteration: Optional[int] = None,
            weights_only: bool = False, force: bool = False, progress: Progress = quiet,
            precision: Optional[str] = None) -> Checkpoint:
    """Write the checkpoint in `load_dir` into `save_dir` at `target` (weights, and unless weights_only or the
    source has none, the Adam state). Its ZeRO-0 form is written for a run in `precision` (fp32, fp16, bf16;
    None: a dense model's fp32, a mixture-of-experts model's the source's); a mixture-of-experts model's also,
    with target.data, for ZeRO 1-2 at that data-parallel size. Returns the source checkpoint."""
    check_output_directory("--save", save_dir, force, {"--load": load_dir})  # before reading anything large
    source = read_checkpoint(load_dir, iteration, progress, streamed=True)  # each target file reads its own tensors
    config = gpt_config(source.model_config, source.padded_vocab_size)
    if source.moe is not None:
        check_expert_target(load_dir, source, target, weights_only)
    else:
        check_dense_target(load_dir, target, precision, with_adam=source.has_optimizer_state and not weights_only)
    check_target(config, target)
    optimizer = read_optimizer_state(source, progress) if source.has_optimizer_state and not weights_only else None
    state = training_state(source)
    write_directory_atomically(save_dir, lambda directory: write_checkpoint(
        directory, source.model, config, state, target, optimizer, progress,
        precision or (source.flags.precision if source.moe is not None else "fp32")), force=force)
    return source


def check_dense_target(load_dir: str, target: TargetLayout, precision: Optional[str],
                       with_adam: bool = True) -> None:
    """Raise InputError for a dense model's target flags that do not fit. Its Adam state resumes at ZeRO 1-3 at
    any data-parallel size and precision (the universal files), and at ZeRO 0 in the precision of its ZeRO-0
    form: FP16_UnfusedOptimizer's for fp16 and bf16, except on the pipeline engine in bf16, where DeepSpeed's
    BF16_Optimizer keeps it per data-parallel rank (bf16_slices.py), for one data-parallel size, which only a
    conversion `with_adam` (not --weights-only, from a source that has the state) needs."""
    slices = precision == "bf16" and target.pipeline_engine
    if target.data is not None and not slices:
        raise InputError(f"--target-data-parallel-size cuts the Adam state of {load_dir}, a dense model, only for "
                         "the pipeline engine in bf16 (--target-bf16 without --target-no-pipeline-parallel), whose "
                         "optimizer keeps it per data-parallel rank; the other forms resume at any data-parallel "
                         "size: drop the flag")
    if slices and with_adam and (target.data is None or target.data < 1):
        raise InputError("--target-bf16 for the pipeline engine writes DeepSpeed's BF16_Optimizer state, one file per "
                         "data-parallel rank: add --target-data-parallel-size D, the resumed run's world size / "
                         f"(TP {target.tensor} x PP {target.pipeline})")


def check_expert_target(load_dir: str, source: Checkpoint, target: TargetLayout, weights_only: bool) -> None:
    """Raise InputError when a mixture-of-experts checkpoint cannot be written at `target`. Its weights can: the
    expert files are named by global expert index at any expert-parallel size. So can its Adam state, regrouped
    per target expert-parallel rank (checkpoint/formats/expert_optimizer_state.py), when the source ran without tensor
    parallelism: with it, DeepSpeed's consecutive expert-parallel groups mix tensor-parallel ranks, a layout no
    run here has written (gloo cannot train it)."""
    if target.pipeline_engine:
        raise InputError(f"--load {load_dir} holds a mixture-of-experts model, which runs on the plain engine "
                         "only; add --target-no-pipeline-parallel")
    if source.has_optimizer_state and not weights_only and source.layout.tensor > 1 and not source.layout.universal:
        raise InputError(f"--load {load_dir} holds a mixture-of-experts model trained at tensor-parallel size "
                         f"{source.layout.tensor}, whose per-rank Adam state is not regrouped; add --weights-only "
                         "(the resumed run starts the optimizer fresh)")
    uneven = [count for count in source.moe.num_experts if count % target.expert]
    if target.expert < 1 or uneven:
        raise InputError(f"--target-expert-parallel-size {target.expert} does not divide the --num-experts "
                         f"{' '.join(map(str, source.moe.num_experts))} of {load_dir}; choose one that divides each")
    if target.data is not None and (target.data < 1 or target.data % target.expert):
        raise InputError(f"--target-data-parallel-size {target.data} is not a multiple of the target's expert-parallel "
                         f"size {target.expert} (each expert is held by data-parallel size / EP ranks); choose one")
    if target.data is not None and target.tensor > 1:
        raise InputError(f"--target-data-parallel-size with --target-tensor-parallel-size {target.tensor}: ZeRO "
                         "partitions are written for tensor-parallel size 1 only (DeepSpeed's expert-parallel groups "
                         "then mix tensor-parallel ranks); leave it out to resume at --zero-stage 0")
