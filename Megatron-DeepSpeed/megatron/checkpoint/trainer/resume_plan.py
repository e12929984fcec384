"""What a run started with --load takes from the checkpoint, decided from the flags it records before any
engine exists (the DeepSpeed config depends on it), with a clear error where the layouts do not fit.

A checkpoint the trainer wrote (native) resumes only at its own layout: DeepSpeed cannot re-partition ZeRO
optimizer state for another data-parallel size, and tensor-parallel shards or pipeline stages of another
layout would not fit the model. Loading its weights only (--finetune, --no-load-optim) frees the
data-parallel size and, between ZeRO stages 0-2, the stage (their weights files do not depend on either).
A checkpoint written by tools/convert_checkpoint.py (universal) resumes at any data-parallel size and ZeRO
stage: ZeRO 1-3 load its per-parameter state through DeepSpeed's universal-checkpoint loader, ZeRO 0 its
ZeRO-0 form, in the precision it was converted for (fp32 unless the converter's --target-fp16 or --target-bf16
said) and, for the pipeline engine's BF16_Optimizer slices, at the data-parallel size it was cut for
(check_zero0_precision; ResumePlan.bf16_slices: the trainer loads those itself). A converted mixture-of-experts
checkpoint's Adam state loads at ZeRO 0 in the precision it was converted for, and at ZeRO 1-2 at the
data-parallel size it was converted for, if any (check_expert_optimizer_state). Tensor- and pipeline-parallel
sizes and the engine must match in every case; the message names the conversion that makes them match.
DeepSpeed's own universal checkpoints (ds_to_universal's output, named by `latest_universal`;
--universal-checkpoint) hold no engine weight files and resume through that loader alone, at any layout.

Checkpoints the engine cannot load as they are (the Megatron layout; pipeline or universal checkpoints of
earlier versions of this project, numbered differently) load their weights only (--finetune, --no-load-optim:
read by formats/reader.py and copied into this rank's modules, at any layout); a full resume of them is refused with the
one command that converts them.
"""
import dataclasses
import os
from dataclasses import dataclass
from typing import Mapping, Optional, Tuple

from megatron.checkpoint.client_state import has_rng, is_current
from megatron.checkpoint.file_names import (ARGS, LATEST_ITERATION_FILE, LATEST_TAG_FILE, LATEST_UNIVERSAL_FILE,
                                            OPTIMIZER_DATA_PARALLEL_SIZE, OPTIMIZER_PRECISION, RELEASE, TOKENS)
from megatron.checkpoint.formats.detect import (UNIVERSAL_FILES, Layout, gate_up_rows, holds_optimizer_state,
                                                layout_of, read_client_state, weights_kind)
from megatron.checkpoint.formats.locate import checkpoint_directory
from megatron.config.recorded_flags import RecordedFlags
from megatron.checkpoint.shards import INTERLEAVED
from megatron.checkpoint.trust import trusting
from megatron.config.model_config import ARCHITECTURE_FLAGS
from megatron.errors import InputError

# The mixture-of-experts flags a checkpoint must share with the run: which layers hold how many experts, and how
# they are spread (DeepSpeed saves the experts' optimizer state per expert-parallel rank).
MOE_FLAGS = ("num_experts", "expert_interval", "mlp_type", "moe_expert_parallel_size")
# How the experts are split: at TP > 1 each rank's expert files hold whole experts, or with this flag its shards.
EXPERT_SPLIT_FLAG = "enable_expert_tensor_parallelism"
# The flags that define the learning-rate schedule; Megatron checks them against the checkpoint's.
SCHEDULE_FLAGS = ("lr", "min_lr", "lr_decay_style", "lr_decay_iters", "lr_decay_samples", "lr_warmup_iters",
                  "lr_warmup_samples", "lr_warmup_fraction")


@dataclass(frozen=True)
class LoadOptions:
    """The loading flags (Megatron's names and meanings)."""
    finetune: bool = False  # weights only; iteration, optimizer, schedule and RNG start fresh
    no_load_optim: bool = False
    no_load_rng: bool = False
    override_lr_scheduler: bool = False  # the command line's schedule, whatever the checkpoint's
    use_checkpoint_lr_scheduler: bool = False  # the checkpoint's schedule, whatever the command line's
    reset_iteration: bool = False  # restore everything but the iteration and consumed-sample counts
    universal: bool = False  # --universal-checkpoint: the checkpoint latest_universal names
    trust_checkpoint: Tuple[str, ...] = ()  # types allowed beyond the allow-list (checkpoint/trust.py)
    evaluation_only: bool = False  # --skip-train: the weights alone are read (see ResumePlan.foreign)


@dataclass(frozen=True)
class ResumePlan:
    tag: str  # the global_step directory to load
    universal: bool  # load through DeepSpeed's universal-checkpoint loader (checkpoint.load_universal)
    load_optimizer: bool  # False: weights only, the optimizer starts fresh
    load_rng: bool
    restore_progress: bool  # iteration and consumed samples (False with --finetune)
    padded_vocab_size: Optional[int]  # recorded by the checkpoint; the run must use it
    schedule: Mapping[str, object]  # the checkpoint's learning-rate flags, for --use-checkpoint-lr-scheduler
    # its weights are read here (each rank its shard) and copied in: a layout the engine cannot load, or an
    # evaluation-only run, for which DeepSpeed's load would read whole model-states files, the optimizer state
    # that ZeRO 0 embeds in them included
    foreign: bool = False
    # the pipeline engine at ZeRO 0 in bf16: BF16_Optimizer's state is loaded from its per-data-parallel-rank
    # files by the trainer (DeepSpeed's ZeRO-0 path cannot: checkpoint/reshape/bf16_slices.py)
    bf16_slices: bool = False
    trusted: Tuple[str, ...] = ()  # --trust-checkpoint: the types its files may hold beyond the allow-list
    # the ZeRO stage at which the optimizer state loads, which a run that chose none takes (None: the run's own)
    zero_stage: Optional[int] = None
    tokens: Optional[int] = None  # the training tokens the checkpoint consumed (None: progress not restored)
    seq_length: Optional[int] = None  # the --seq-length it recorded (a curriculum's tokens are fewer than samples x it)


def _weights_copy_in_applies(state: Mapping, run: Layout) -> bool:
    """Whether an evaluation-only run can copy the weights in: not into ZeRO-3 partitions, not an MoE model
    (its experts load through DeepSpeed's expert files)."""
    return run.zero_stage != 3 and RecordedFlags.of(state[ARGS]).whole_model_moe is None


def _pointer_exists(load_dir: str, universal: bool) -> bool:
    names = (LATEST_UNIVERSAL_FILE,) if universal else (LATEST_TAG_FILE, LATEST_UNIVERSAL_FILE, LATEST_ITERATION_FILE)
    return any(os.path.exists(os.path.join(load_dir, name)) for name in names)


def _unloadable(load_dir: str, what: str, layout: Layout) -> InputError:
    return InputError(f"--load {load_dir} holds {what}, which DeepSpeed's engine cannot resume as it is (its weights "
                      f"alone load with --finetune or --no-load-optim); convert it once with\n  "
                      f"{convert_command(load_dir, layout.tensor, layout.pipeline, layout.pipeline_engine)}"
                      f"\nthen --load the new directory")


def convert_command(load_dir: str, tensor: int, pipeline: int, pipeline_engine: bool) -> str:
    engine = "" if pipeline_engine else " --target-no-pipeline-parallel"
    return (f"python Megatron-DeepSpeed/tools/convert_checkpoint.py --load {load_dir} --save {load_dir}-tp{tensor}-pp"
            f"{pipeline} --target-tensor-parallel-size {tensor} --target-pipeline-parallel-size {pipeline}{engine}")


def _layout_error(load_dir: str, checkpoint: Layout, run: Layout, why: str) -> InputError:
    return InputError(
        f"--load {load_dir}: the checkpoint was written at {checkpoint.describe()}, but this run is "
        f"{run.describe()}; {why}. Reshape it once with\n  "
        f"{convert_command(load_dir, run.tensor, run.pipeline, run.pipeline_engine)}\n"
        f"then --load the new directory (it resumes at any data-parallel size and ZeRO stage)")


def check_layout(load_dir: str, checkpoint: Layout, run: Layout, weights_only: bool) -> None:
    if (checkpoint.tensor, checkpoint.pipeline, checkpoint.pipeline_engine) != \
            (run.tensor, run.pipeline, run.pipeline_engine):
        raise _layout_error(load_dir, checkpoint, run, "tensor-parallel shards, pipeline stages and the engine "
                                                       "must match")
    if checkpoint.universal:
        return
    if weights_only:
        if max(checkpoint.zero_stage, run.zero_stage) == 3 and checkpoint.zero_stage != run.zero_stage:
            raise _layout_error(load_dir, checkpoint, run, "ZeRO stage 3 keeps its weights in its own partitions")
        return
    if (checkpoint.data, checkpoint.zero_stage) != (run.data, run.zero_stage):
        raise _layout_error(load_dir, checkpoint, run, "DeepSpeed re-partitions no optimizer state for another "
                                                       "data-parallel size or ZeRO stage (or pass --no-load-optim to "
                                                       "load the weights only)")


def check_model_flags(load_dir: str, recorded: Mapping[str, object], run_flags: Mapping[str, object]) -> None:
    """The run's model flags (a ModelConfig's to_flags) must repeat the architecture the checkpoint records."""
    differing = [flag for flag in ARCHITECTURE_FLAGS + MOE_FLAGS
                 if flag in recorded and recorded[flag] != run_flags.get(flag)]
    if differing:
        described = ", ".join(f"--{flag.replace('_', '-')} {run_flags.get(flag)} (checkpoint: {recorded[flag]})"
                              for flag in differing)
        raise InputError(f"--load {load_dir} holds a different model: {described}; give the checkpoint's values")


def check_expert_split(load_dir: str, recorded: Mapping[str, object], run_flags: Mapping[str, object],
                       tensor: int) -> None:
    """A mixture-of-experts checkpoint saved at tensor-parallel size above 1 holds whole experts per rank, or with
    --enable-expert-tensor-parallelism each rank's shards of them: the run must split them as it did."""
    flags = RecordedFlags.of(recorded)
    recorded_split, run_split = flags.experts_split, bool(run_flags.get(EXPERT_SPLIT_FLAG))
    if tensor > 1 and flags.has_experts and recorded_split != run_split:
        held = "shards of each expert" if recorded_split else "whole experts"
        raise InputError(f"--load {load_dir} holds {held} per tensor-parallel rank: "
                         f"{'add' if recorded_split else 'drop'} --enable-expert-tensor-parallelism, or convert it to "
                         "--target-tensor-parallel-size 1 with tools/convert_checkpoint.py first")


def check_expert_optimizer_state(load_dir: str, state: Mapping[str, object], run: Layout, precision: str) -> None:
    """A converted mixture-of-experts checkpoint keeps its Adam state in DeepSpeed's per-expert-parallel-rank
    files, which the engine reads at ZeRO stage 0 only, each in the form of one precision (the converter's
    --target-fp32/fp16/bf16; checkpoint/formats/expert_optimizer_state.py), and, when converted with
    --target-data-parallel-size, in ZeRO 1-2 partitions that load at that data-parallel size only
    (checkpoint/reshape/expert_zero_partitions.py)."""
    zero_size = state.get(OPTIMIZER_DATA_PARALLEL_SIZE)
    if run.zero_stage >= 1 and zero_size is None:
        raise InputError(f"--load {load_dir}: a converted mixture-of-experts checkpoint's Adam state is kept in "
                         "DeepSpeed's per-expert-parallel-rank files, which load at ZeRO stage 0 only; resume it "
                         "with --zero-stage 0, or pass --no-load-optim (or convert it again with "
                         f"--target-data-parallel-size {run.data} for ZeRO 1-2)")
    if run.zero_stage >= 1:
        if run.data != zero_size:
            raise InputError(f"--load {load_dir}: its mixture-of-experts Adam state was cut into ZeRO partitions for "
                             f"data-parallel size {zero_size}, and this run's is {run.data} (DeepSpeed re-partitions "
                             f"none); resume it at data-parallel size {zero_size} or at --zero-stage 0, convert it "
                             f"again with --target-data-parallel-size {run.data}, or pass --no-load-optim")
        return
    check_zero0_precision(load_dir, state, run, precision, "mixture-of-experts ")


def check_zero0_precision(load_dir: str, state: Mapping[str, object], run: Layout, precision: str,
                          what: str = "") -> None:
    """A converted checkpoint's ZeRO-0 Adam state is in the form of one precision (recorded by the converter;
    fp32 when it records none, as earlier converters wrote): torch's AdamW state_dict, or DeepSpeed's
    FP16_UnfusedOptimizer's for fp16 and bf16; on the pipeline engine in bf16, BF16_Optimizer's slices for one
    data-parallel size (checkpoint/reshape/bf16_slices.py)."""
    written, sliced = state.get(OPTIMIZER_PRECISION, "fp32"), precision == "bf16" and run.pipeline_engine
    again = f"--target-{precision}" + (f" --target-data-parallel-size {run.data}" if sliced else "")
    anywhere = "" if what else " (or resume it at --zero-stage 1 or higher, in any precision)"
    if precision != written:
        flags = f"--{written}" if written != "fp32" else "neither --fp16 nor --bf16"
        raise InputError(f"--load {load_dir}: its {what}Adam state was converted for {written} training and this "
                         f"run trains in {precision}; resume it with {flags}, convert it again with "
                         f"tools/convert_checkpoint.py {again}, or pass --no-load-optim{anywhere}")
    if sliced and state.get(OPTIMIZER_DATA_PARALLEL_SIZE) != run.data:
        raise InputError(f"--load {load_dir}: its Adam state was cut into BF16_Optimizer's slices for data-parallel "
                         f"size {state.get(OPTIMIZER_DATA_PARALLEL_SIZE)}, and this run's is {run.data}; resume it at "
                         f"that size, convert it again with tools/convert_checkpoint.py {again}, or pass "
                         f"--no-load-optim{anywhere}")


def check_native_precision(load_dir: str, trained: str, run: Layout, precision: str) -> None:
    """A ZeRO-0 checkpoint the trainer saved holds its optimizer state in the form of the precision it trained in
    (torch's AdamW for fp32, DeepSpeed's BF16_Optimizer or FP16 optimizer otherwise), which DeepSpeed loads in that
    precision only."""
    if trained == precision:
        return
    flags = f"--{trained}" if trained != "fp32" else "neither --fp16 nor --bf16"
    sliced = f" --target-data-parallel-size {run.data}" if precision == "bf16" and run.pipeline_engine else ""
    raise InputError(f"--load {load_dir}: it trained in {trained} at ZeRO stage 0, whose optimizer state is in "
                     f"{trained}'s form, and this run trains in {precision}; resume it with {flags}, pass "
                     f"--no-load-optim (weights only), or convert its optimizer state once with\n  "
                     f"{convert_command(load_dir, run.tensor, run.pipeline, run.pipeline_engine)} "
                     f"--target-{precision}{sliced}\nthen --load the new directory")


def _stage_that_loads(load_dir: str, state: Mapping, layout: Layout, run: Layout, precision: str,
                      from_universal_files: bool) -> Optional[int]:
    """For a run whose user chose no ZeRO stage, the stage at which the checkpoint's optimizer state loads where the
    run's default cannot load it (None: the run's stage does): a native checkpoint's own (DeepSpeed loads its
    optimizer files at that stage only); ZeRO 1 for a universal one that ZeRO 0 cannot load (DeepSpeed's, or ours
    converted for another precision or data-parallel size: ZeRO's universal loader reads it in any)."""
    if not (layout.universal or from_universal_files):
        return layout.zero_stage if layout.zero_stage != run.zero_stage else None
    if run.zero_stage != 0 or RecordedFlags.of(state[ARGS]).whole_model_moe is not None:
        return None
    if from_universal_files:
        return 1
    try:
        check_zero0_precision(load_dir, state, run, precision)
    except InputError:  # its ZeRO-0 form is another precision's, or another data-parallel size's
        return 1
    return None


def plan_resume(load_dir: Optional[str], run: Layout, options: LoadOptions, precision: str,
                model_flags: Mapping[str, object], zero_stage_chosen: bool = True) -> Optional[ResumePlan]:
    """None when there is nothing to resume from (no --load, or no checkpoint in it yet: a fresh run).
    `precision`: the run's, fp32, fp16 or bf16. Without `zero_stage_chosen` (the stage is the default) a full
    resume takes the stage at which the optimizer state loads (_stage_that_loads)."""
    if not load_dir or not _pointer_exists(load_dir, options.universal):
        return None
    if options.override_lr_scheduler and options.use_checkpoint_lr_scheduler:
        raise InputError("--override-lr-scheduler and --use-checkpoint-lr-scheduler contradict each other; give one")
    universal_pointer = options.universal or not os.path.exists(os.path.join(load_dir, LATEST_TAG_FILE))
    tag_dir = checkpoint_directory(load_dir, universal=universal_pointer and os.path.exists(
        os.path.join(load_dir, LATEST_UNIVERSAL_FILE)))
    with trusting(options.trust_checkpoint):
        state = read_client_state(tag_dir, verify=False)  # guard.py verified it at start-up
    layout = layout_of(state, tag_dir)
    weights_only = options.finetune or options.no_load_optim
    interleaved = gate_up_rows(tag_dir, state) == INTERLEAVED  # read through the reader, which puts them in halves
    foreign = layout.megatron or interleaved or (not is_current(state) and (layout.pipeline_engine or
                                                                            layout.universal))
    if foreign and not weights_only:
        what = (f"a Megatron-layout checkpoint ({os.path.basename(tag_dir)}/mp_rank_*/model_optim_rng.pt), without "
                "optimizer state" if layout.megatron else "a --swiglu checkpoint whose dense_h_to_4h rows are "
                "[ffn, (gate, up)] interleaved (this project's layout before it took upstream's per-rank [gate; up] "
                "halves)" if interleaved else "a checkpoint an earlier version of this project wrote "
                "(pipeline pieces numbered from layer_00)")
        raise _unloadable(load_dir, what, layout)
    if foreign and run.zero_stage == 3:
        raise InputError(f"--load {load_dir}: its weights are copied into this run's modules, which ZeRO stage 3 "
                         "partitions; load it with --zero-stage 0-2, or convert it first")
    check_model_flags(load_dir, state[ARGS], model_flags)
    check_expert_split(load_dir, state[ARGS], model_flags, layout.tensor)
    load_optimizer = holds_optimizer_state(tag_dir, state) and not weights_only
    # ds_to_universal copies only the model-states files: no engine weights to read
    from_universal_files = not foreign and weights_kind(tag_dir, state, layout) == UNIVERSAL_FILES
    adopted_stage = None if zero_stage_chosen or foreign or not load_optimizer else _stage_that_loads(
        load_dir, state, layout, run, precision, from_universal_files)
    if adopted_stage is not None:
        run = dataclasses.replace(run, zero_stage=adopted_stage)
    if not (from_universal_files or foreign):
        check_layout(load_dir, layout, run, weights_only=not load_optimizer)
    elif from_universal_files and run.zero_stage == 0:
        raise InputError(f"--load {load_dir}: DeepSpeed's universal checkpoint {os.path.basename(tag_dir)} loads "
                         "through ZeRO's universal loader only; resume it with --zero-stage 1 (or higher)")
    # a converted MoE checkpoint's Adam state is in DeepSpeed's own files, which its usual loader reads
    expert_state = layout.universal and load_optimizer and RecordedFlags.of(state[ARGS]).whole_model_moe is not None
    universal = from_universal_files or (layout.universal and not foreign and run.zero_stage >= 1
                                         and (load_optimizer or run.zero_stage == 3) and not expert_state)
    if universal and run.zero_stage == 3 and run.tensor > 1:
        raise InputError(f"--load {load_dir}: DeepSpeed's universal-checkpoint loader cannot cut tensor-parallel "
                         "shards under ZeRO stage 3; resume it with --zero-stage 1 or 2")
    if expert_state:
        check_expert_optimizer_state(load_dir, state, run, precision)
    elif layout.universal and load_optimizer and run.zero_stage == 0:
        check_zero0_precision(load_dir, state, run, precision)
    flags = RecordedFlags.of(state[ARGS])
    if load_optimizer and not (foreign or universal or layout.universal) and run.zero_stage == 0:
        check_native_precision(load_dir, flags.precision, run, precision)
    release = os.path.basename(tag_dir) == RELEASE  # Megatron's: weights to start from, no progress
    bf16_slices = (load_optimizer and not (foreign or universal) and run.pipeline_engine and run.zero_stage == 0
                   and precision == "bf16")
    return ResumePlan(tag=os.path.basename(tag_dir), universal=universal, load_optimizer=load_optimizer,
                      bf16_slices=bf16_slices,
                      load_rng=not (options.finetune or options.no_load_rng or foreign) and has_rng(state),
                      restore_progress=not (options.finetune or options.reset_iteration or release),
                      foreign=foreign or (options.evaluation_only and _weights_copy_in_applies(state, run)),
                      padded_vocab_size=flags.padded_vocab_size,
                      schedule={flag: flags.recorded.get(flag) for flag in SCHEDULE_FLAGS},
                      trusted=options.trust_checkpoint,
                      zero_stage=adopted_stage,
                      tokens=None if options.finetune or options.reset_iteration or release else state.get(TOKENS),
                      seq_length=flags.recorded.get("seq_length"))


def resolve_schedule(run_flags: Mapping[str, object], plan: ResumePlan, options: LoadOptions) -> dict:
    """The learning-rate flags the resumed run must change to continue as Megatron does (empty: none): without
    either option they must already equal the checkpoint's; a fine-tuning run starts its own schedule."""
    if options.finetune or options.override_lr_scheduler:
        return {}
    differing = [flag for flag in SCHEDULE_FLAGS if plan.schedule.get(flag) is not None
                 and run_flags.get(flag) != plan.schedule[flag]]
    if options.use_checkpoint_lr_scheduler:
        return {flag: plan.schedule[flag] for flag in differing}
    if differing:
        described = ", ".join(f"--{flag.replace('_', '-')} {run_flags.get(flag)} (checkpoint: "
                              f"{plan.schedule[flag]})" for flag in differing)
        raise InputError(f"the learning-rate schedule differs from the checkpoint's: {described}; pass "
                         "--override-lr-scheduler to use this command line's, or --use-checkpoint-lr-scheduler to "
                         "continue the checkpoint's")
    return {}
