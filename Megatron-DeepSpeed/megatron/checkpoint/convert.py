"""The conversions tools/convert_checkpoint.py offers, each writing its whole output directory atomically:
reshape a checkpoint into another tensor/pipeline layout, export it as a Hugging Face GPT-2 directory, or
import one as a checkpoint ready for `--load DIR --finetune`."""
import json
import os
import shutil
from typing import Mapping, Optional

from megatron.checkpoint import hf
from megatron.checkpoint.directory import load_file, precision_of, read_client_state
from megatron.checkpoint.optimizer_state import read_optimizer_state
from megatron.checkpoint.client_state import rng_states, tracker_states
from megatron.checkpoint.layout import model_parallel_rank, model_states_file
from megatron.checkpoint.reader import Checkpoint, read_checkpoint
from megatron.checkpoint.weight_units import Progress, quiet
from megatron.checkpoint.writer import TargetLayout, TrainingState, check_target, write_checkpoint
from megatron.errors import InputError
from megatron.files.atomic import write_directory_atomically
from megatron.config.model_config import ModelConfig
from megatron.model.gpt import GPTConfig
from megatron.model.gpt_config import gpt_config
from megatron.tokenizer import vocab_size_with_padding

GPT2_TOKENIZER_FILES = (("vocab_file", "vocab.json"), ("merge_file", "merges.txt"))


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
    if os.path.exists(save_dir) and not force:  # before reading anything large
        raise InputError(f"--save {save_dir} already exists; choose another directory, or pass --force to replace it")
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
        precision or (precision_of(source.args) if source.moe is not None else "fp32")), force=force)
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
    per target expert-parallel rank (checkpoint/expert_optimizer_state.py), when the source ran without tensor
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


def unpadded_vocab_size(args: Mapping[str, object]) -> int:
    """The tokenizer's vocabulary size the checkpoint was trained with (rows past it are padding)."""
    if args.get("tokenizer_vocab_size"):
        return int(args["tokenizer_vocab_size"])
    from megatron.tokenizer import build_tokenizer
    try:
        return build_tokenizer(args["tokenizer_type"], vocab_file=args.get("vocab_file"),
                               merge_file=args.get("merge_file"), tokenizer_model=args.get("tokenizer_model"),
                               vocab_size=args.get("vocab_size")).vocab_size
    except InputError as err:
        raise InputError(f"the checkpoint does not record its vocabulary size and its tokenizer cannot be built "
                         f"to tell it ({err}); restore the tokenizer files it names") from err


def export_hf(load_dir: str, hf_dir: str, iteration: Optional[int] = None, force: bool = False,
              progress: Progress = quiet) -> Checkpoint:
    """Write the checkpoint as a transformers GPT2LMHeadModel directory, padded vocabulary rows dropped; the
    GPT-2 tokenizer files go along when the checkpoint's --vocab-file / --merge-file still exist."""
    if os.path.exists(hf_dir) and not force:
        raise InputError(f"--to-hf {hf_dir} already exists; choose another directory, or pass --force to replace it")
    source = read_checkpoint(load_dir, iteration, progress)
    args, model_config = source.args, source.model_config
    config = gpt_config(model_config, source.padded_vocab_size)
    if source.moe is not None:
        raise InputError(f"--to-hf: {load_dir} holds a mixture-of-experts model, and transformers' GPT-2 has no "
                         "experts; it cannot be exported")
    vocab_size = unpadded_vocab_size(args)
    weights = hf.to_hf_state_dict(source.model, config, vocab_size)
    dtype = next(iter(source.model.values())).dtype
    config_json = hf.hf_config(model_config, vocab_size, dtype)
    tokenizer_files = [(args.get(flag), name) for flag, name in GPT2_TOKENIZER_FILES]
    copy_tokenizer = args.get("tokenizer_type") == "GPT2BPETokenizer" and all(
        path and os.path.isfile(path) for path, _ in tokenizer_files)

    def fill(directory: str) -> None:
        progress(f"writing {hf.WEIGHTS_FILE} ({len(weights)} tensors)")
        hf.write_hf_directory(directory, weights, config_json)
        if copy_tokenizer:
            for path, name in tokenizer_files:
                shutil.copyfile(path, os.path.join(directory, name))
            with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as handle:
                json.dump({"tokenizer_class": "GPT2Tokenizer", "model_max_length": config.max_position_embeddings,
                           "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
                           "unk_token": "<|endoftext|>"}, handle, indent=2)

    write_directory_atomically(hf_dir, fill, force=force)
    return source


def imported_args(hf_config: Mapping[str, object], model: ModelConfig, vocab_size: int, padded_vocab_size: int,
                  make_vocab_size_divisible_by: int) -> dict:
    """The flags an imported checkpoint records: the model's and the vocabulary; training flags are the
    fine-tuning run's own."""
    return {**model.to_flags(), "seq_length": model.max_position_embeddings, "fp16": False, "bf16": False,
            "make_vocab_size_divisible_by": make_vocab_size_divisible_by, "tokenizer_vocab_size": vocab_size,
            "padded_vocab_size": padded_vocab_size, "zero_stage": 0, "data_parallel_size": 1,
            "imported_from": "transformers GPT2LMHeadModel (" + str(hf_config.get("_name_or_path", "")) + ")"}


def import_hf(hf_dir: str, save_dir: str, target: TargetLayout, make_vocab_size_divisible_by: int = 128,
              force: bool = False, progress: Progress = quiet) -> GPTConfig:
    """Write a local GPT2LMHeadModel directory as a checkpoint (iteration 0, weights only) at `target`, the
    vocabulary padded for it; resume it with `--load save_dir --finetune`."""
    if os.path.exists(save_dir) and not force:
        raise InputError(f"--save {save_dir} already exists; choose another directory, or pass --force to replace it")
    hf_config = hf.read_hf_config(hf_dir)
    model_config = hf.model_config_from_hf(hf_config, os.path.join(hf_dir, hf.CONFIG_FILE))
    vocab_size = int(hf_config["vocab_size"])
    padded = vocab_size_with_padding(vocab_size, make_vocab_size_divisible_by, target.tensor)
    config = gpt_config(model_config, padded)
    check_target(config, target)
    progress(f"reading {hf_dir}")
    model = hf.from_hf_state_dict(hf.read_hf_weights(hf_dir), config, vocab_size)
    args = imported_args(hf_config, model_config, vocab_size, padded, make_vocab_size_divisible_by)
    state = TrainingState(iteration=0, consumed_train_samples=0, args=args)
    write_directory_atomically(save_dir, lambda directory: write_checkpoint(
        directory, model, config, state, target, None, progress), force=force)
    return config
