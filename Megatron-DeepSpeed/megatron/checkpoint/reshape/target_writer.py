"""Write full weights (and Adam state) as a checkpoint that pretrain_gpt.py --load resumes at a chosen
tensor- and pipeline-parallel layout, at ANY data-parallel size and ZeRO stage.

The data-parallel size and the ZeRO stage are left open by writing what DeepSpeed 0.19.8 can load at any of
them:
  global_step{N}/mp_rank_{mp:02d}_model_states.pt   per model-parallel rank: the client state (iteration,
        consumed samples, flags, RNG) and DeepSpeed's bookkeeping; under the plain engine the rank's weights
        (`module`); for ZeRO stage 0, the rank's Adam state (`optimizer`), which does not depend on the
        data-parallel size, in the form of the target's precision (`optimizer_precision` records it): torch's
        AdamW state_dict for fp32 (a dense model's default), DeepSpeed's FP16_UnfusedOptimizer state (master
        weights, loss scale; mixed_precision_state.zero0_state) for fp16, and for bf16 on the plain engine.
        The pipeline engine in bf16 steps DeepSpeed's BF16_Optimizer instead, whose state is written for the
        target data-parallel size D only, in global_step{N}/bf16_zero_pp_rank_{dp}_mp_rank_{mp:02d}_optim_states.pt
        (checkpoint/reshape/bf16_slices.py), `optimizer` then None.
  global_step{N}/layer_{piece:02d}-model_{tp:02d}-model_states.pt   under the pipeline engine, each piece's
        weights (the files DeepSpeed's PipelineModule reads).
  global_step{N}/zero/<parameter>/{fp32,exp_avg,exp_avg_sq,step}.pt + zero/optimizer_state.pt   DeepSpeed's
        "universal checkpoint": one file per full parameter and state, named as the engine names the
        parameter, with the dimension its tensor-parallel shards are cut along. ZeRO 1, 2 and 3 load it at any
        data-parallel size (checkpoint.load_universal), cutting the rank's partition themselves.
  global_step{N}/layer_{i}_expert_{e}_mp_rank_{mp:02d}_model_states.pt   a mixture-of-experts model's experts
        (plain engine), one file per expert by global index: any expert-parallel size reads them. Their keys
        carry upstream's module path (language_model.encoder.layers.N.mlp...), the only one upstream's trainer
        loads; this trainer loads both.
  global_step{N}/expp_rank_{r}_mp_rank_{mp:02d}_optim_states.pt   its Adam state per expert-parallel rank of the
        target, which DeepSpeed reads at ZeRO stage 0 only, in the form of the target's precision: torch's
        AdamW state_dict for fp32, DeepSpeed's FP16_UnfusedOptimizer state (master weights, loss scale) for
        fp16 and bf16 (checkpoint/formats/expert_optimizer_state.py); the mp_rank files record which precision.
  global_step{N}/[bf16_]zero_pp_rank_{dp}_mp_rank_{mp:02d}_optim_states.pt   with a target data-parallel size,
        that Adam state also as DeepSpeed's ZeRO 1-2 partitions for it (checkpoint/reshape/expert_zero_partitions.py),
        which load at that size only; the mp_rank files record it.
  latest, latest_universal, latest_checkpointed_iteration.txt
With --weights-only the Adam state is left out (zero/ then holds fp32.pt only) and resuming starts the
optimizer fresh. The caller writes into a fresh directory and renames it into place (tools/convert_checkpoint.py).
"""
import argparse
import importlib.metadata
import os
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Tuple

import torch

from megatron.checkpoint.reshape.bf16_slices import rank_slices
from megatron.checkpoint.client_state import build_client_state, recorded_args, universal_info
from megatron.checkpoint.formats.expert_optimizer_state import rank_optimizer
from megatron.checkpoint.reshape.expert_zero_partitions import rank_partitions
from megatron.checkpoint.file_names import (CONSUMED_TRAIN_SAMPLES, EXPERT_KEY_PATTERN, LATEST_ITERATION_FILE,
                                        LATEST_TAG_FILE, LATEST_UNIVERSAL_FILE, OPTIMIZER_DATA_PARALLEL_SIZE,
                                        OPTIMIZER_PRECISION, UNIVERSAL_MARK, expert_file, expert_optimizer_file,
                                        layer_file, model_parallel_rank, model_states_file, optimizer_states_file)
from megatron.checkpoint.manifest import write_manifest
from megatron.checkpoint.formats.mixed_precision_state import target_loss_scale, zero0_state
from megatron.config.recorded_flags import RecordedFlags
from megatron.checkpoint.parameter_names import (EMBEDDING_PREFIX, OUTPUT_LAYER_WEIGHT, model_name, nest,
                                       positions_with_parameters, spec_position, stage_name, upstream_expert_key)
from megatron.checkpoint.formats.checkpoint import OptimizerState
from megatron.checkpoint.formats.zero0 import decay_groups
from megatron.checkpoint.formats.pipeline_engine import pipeline_stage_pieces
from megatron.checkpoint.torch_files import own_storages, save
from megatron.checkpoint.shards import shard_of
from megatron.checkpoint.reshape.universal_files import UniversalFiles
from megatron.checkpoint.formats.weight_units import Progress, quiet
from megatron.config.flags.optimizer import weight_decayed
from megatron.errors import InputError
from megatron.model.gpt import GPTConfig
from megatron.model.pipe import EMBEDDING_SPEC, final_norm_spec


@dataclass(frozen=True)
class TargetLayout:
    tensor: int
    pipeline: int
    pipeline_engine: bool = True  # False: DeepSpeed's plain engine (--no-pipeline-parallel), needs pipeline 1
    expert: int = 1  # expert-parallel size of a mixture-of-experts model (its --moe-expert-parallel-size)
    # the Adam state for this DP size too: a mixture-of-experts model's as ZeRO 1-2 partitions, a dense model's
    # (pipeline engine, bf16) as BF16_Optimizer's ZeRO-0 slices
    data: Optional[int] = None

    def describe(self) -> str:
        engine = "pipeline engine" if self.pipeline_engine else "plain engine (--no-pipeline-parallel)"
        experts = f" x EP {self.expert}" if self.expert > 1 else ""
        zero = f" (optimizer files for DP {self.data})" if self.data else ""
        return f"TP {self.tensor} x PP {self.pipeline}{experts}, any DP and ZeRO stage{zero}, {engine}"


@dataclass(frozen=True)
class TrainingState:
    """What a resumed run continues from besides the weights."""
    iteration: int
    consumed_train_samples: int
    args: Mapping[str, object]  # the flags to record (target layout filled in by write_checkpoint)
    rng_state: Optional[dict] = None  # python / numpy / torch / device generators of the run
    tensor_parallel_rng_states: tuple = ()  # per tensor-parallel rank of the source, its tracker states


def check_target(config: GPTConfig, target: TargetLayout) -> None:
    """Raise InputError, before anything is written, when the model cannot be cut into `target`."""
    tp, pp = target.tensor, target.pipeline
    if tp < 1 or pp < 1:
        raise InputError(f"target tensor- and pipeline-parallel sizes must be at least 1, not {tp} and {pp}")
    for what, value in (("attention heads (--num-attention-heads)", config.num_attention_heads),
                        ("FFN hidden size (--ffn-hidden-size)", config.ffn_hidden_size),
                        ("padded vocabulary size", config.vocab_size)):
        if value % tp:
            raise InputError(f"--target-tensor-parallel-size {tp} does not divide the {what} {value}; choose a "
                             "tensor-parallel size that divides it")
    if pp > config.num_layers:
        raise InputError(f"--target-pipeline-parallel-size {pp} is more than the {config.num_layers} transformer "
                         "layers; every pipeline stage needs at least one")
    if pp > 1 and not target.pipeline_engine:
        raise InputError(f"the plain engine (--no-pipeline-parallel) cannot hold {pp} pipeline stages; use "
                         "--target-pipeline-parallel-size 1 or the pipeline engine")


# ----------------------------------------------------------------------------- names

def engine_parameter_names(names: List[str], num_layers: int, target: TargetLayout, pp_rank: int) -> List[str]:
    """The engine's names of one pipeline stage's parameters, in its module order (GPTModel's order under the
    plain engine; under the pipeline engine the tied embedding first, on the first and last stage)."""
    if not target.pipeline_engine:
        return list(names)
    stage_pieces = pipeline_stage_pieces(num_layers, target.pipeline)[pp_rank]
    tied_piece = None if OUTPUT_LAYER_WEIGHT in names else final_norm_spec(num_layers) + 1
    holds_embedding = EMBEDDING_SPEC in stage_pieces or tied_piece in stage_pieces
    stage = ([stage_name(name, num_layers) for name in names if name.startswith(EMBEDDING_PREFIX)]
             if holds_embedding else [])
    for name in names:
        if not name.startswith(EMBEDDING_PREFIX):
            converted = stage_name(name, num_layers)
            if int(converted.split(".", 1)[0]) in stage_pieces:
                stage.append(converted)
    return stage


# ----------------------------------------------------------------------------- files

def _zero0_groups(stage_names: List[str], universal: UniversalFiles, optimizer: OptimizerState, num_layers: int,
                  tp_size: int) -> Tuple[List[tuple], Dict[str, int]]:
    """The optimizer groups of a rank whose parameters are `stage_names` (module order), as (hyperparameters,
    members in torch's order: the decayed matrices, then the vectors), and each member's shard size. Shapes are
    the universal files' (written by now), so no piece is read for its shape."""
    shapes = {name: _shard_shape(model_name(name, num_layers), universal, tp_size) for name in stage_names}
    ordered = decay_groups([(name, shapes[name]) for name in stage_names])
    decayed = sum(1 for name in stage_names if weight_decayed(shapes[name]))
    groups = list(zip(optimizer.param_groups, (ordered[:decayed], ordered[decayed:])))
    return groups, {name: shapes[name].numel() for name in stage_names}


def _shard_shape(name: str, universal: UniversalFiles, tp_size: int) -> torch.Size:
    """The shape of a tensor-parallel shard of parameter `name`, from its full shape."""
    return shard_of(name, torch.empty(universal.shape(name), device="meta"), 0, tp_size).shape


def _deepspeed_bookkeeping(state: TrainingState, target: TargetLayout) -> dict:
    """The keys DeepSpeed's load_checkpoint reads from a model-states file besides the module."""
    return {"buffer_names": [], "param_shapes": None, "frozen_param_shapes": None, "shared_params": None,
            "frozen_param_fragments": None, "lr_scheduler": None, "data_sampler": None, "random_ltd": None,
            "skipped_steps": 0, "global_steps": state.iteration, "global_samples": state.consumed_train_samples,
            "dp_world_size": target.data or 1, "mp_world_size": target.tensor * target.pipeline,
            "checkpoint_parallel_dimensions": {"pp_degree": target.pipeline, "tp_degree": target.tensor},
            "ds_version": importlib.metadata.version("deepspeed")}


def target_args(args: Mapping[str, object], target: TargetLayout, padded_vocab_size: int) -> dict:
    """The flags to record: the source's, with the target's parallel layout."""
    recorded = dict(args)
    recorded.update(tensor_model_parallel_size=target.tensor, pipeline_model_parallel_size=target.pipeline,
                    no_pipeline_parallel=not target.pipeline_engine, ds_pipeline_enabled=target.pipeline_engine,
                    padded_vocab_size=padded_vocab_size)
    if "moe_expert_parallel_size" in recorded:
        recorded["moe_expert_parallel_size"] = target.expert
    return recorded


def experts_by_file(names: List[str]) -> Dict[Tuple[int, int], List[str]]:
    """The expert parameters among `names`, grouped as DeepSpeed files them: by (MoE layer numbered from 0 in
    model order, global expert index). The files do not depend on the expert-parallel size; only which rank
    reads which does."""
    located = {name: EXPERT_KEY_PATTERN.search(name) for name in names}
    layers = sorted({int(match.group(1)) for match in located.values() if match})
    files: Dict[Tuple[int, int], List[str]] = {}
    for name, match in located.items():
        if match:
            files.setdefault((layers.index(int(match.group(1))), int(match.group(2))), []).append(name)
    return files


def _tensor_parallel_rng(state: TrainingState, tp_rank: int) -> Optional[dict]:
    """The source's tracker states of this rank, or fresh ones seeded as the trainer seeds a new rank."""
    if tp_rank < len(state.tensor_parallel_rng_states):
        return state.tensor_parallel_rng_states[tp_rank]
    if state.rng_state is None:
        return None
    from megatron.tensor_parallel import tensor_parallel_rng_tracker
    return tensor_parallel_rng_tracker(RecordedFlags.of(state.args).seed, tp_rank).get_states()


@dataclass(frozen=True)
class _Writing:
    """What every step of one write_checkpoint call shares."""
    tag_dir: str
    model: Mapping[str, torch.Tensor]
    num_layers: int
    target: TargetLayout
    state: TrainingState
    optimizer: Optional[OptimizerState]
    progress: Progress
    precision: str
    experts: Dict[Tuple[int, int], List[str]]  # experts_by_file's
    dense: List[str]  # the names not in expert files
    split_experts: bool  # each rank's files hold its shards of the experts
    swiglu: bool  # SwiGLU MLPs: dense_h_to_4h's [gate; up] split half by half
    client_args: argparse.Namespace  # the client state's `args`
    info: dict  # universal_checkpoint_info
    universal: UniversalFiles
    loss_scale: Optional[dict]  # the target's, at ZeRO 0 in fp16/bf16

    @property
    def sliced(self) -> bool:
        """BF16_Optimizer's slices for target.data: a dense model's Adam state on the pipeline engine in bf16."""
        return not self.experts and self.target.pipeline_engine and self.precision == "bf16"

    def rank_tensors(self, keys: Mapping[str, str], tp: int, experts_too: bool, held: bool) -> Dict[str, torch.Tensor]:
        """Tensor-parallel rank `tp`'s shard of each parameter (file key -> GPTModel name) for one file; each
        parameter's universal files are written as its full tensor is read, while its source piece is held. A
        file `held` while later pieces are read (the plain engine's module) takes copies: a tensor read as it
        lies in its source file is a view of that file's memory map, which it would keep open."""
        tensors = {}
        for key, name in keys.items():
            shard = shard_of(name, self.model[name], tp, self.target.tensor, experts_too, self.swiglu)
            tensors[key] = shard.clone() if held else shard
            self.universal.write([name])
        return tensors if held else own_storages(tensors)


def _prepare(out_dir: str, model: Mapping[str, torch.Tensor], config: GPTConfig, state: TrainingState,
             target: TargetLayout, optimizer: Optional[OptimizerState], progress: Progress, precision: str) -> _Writing:
    """Check the target and settle what the files record: the flags (the target's layout filled in), the
    universal info and the loss scale."""
    check_target(config, target)
    names = list(model)
    experts = experts_by_file(names)
    in_expert_files = {name for group in experts.values() for name in group}
    if experts and target.pipeline_engine:
        raise InputError("a mixture-of-experts checkpoint is written for the plain engine (--no-pipeline-parallel)")
    flags = target_args(state.args, target, config.vocab_size)
    recorded = RecordedFlags.of(flags)
    split_experts = recorded.experts_split
    client_args = recorded_args({key: value for key, value in flags.items() if key != CONSUMED_TRAIN_SAMPLES},
                                state.consumed_train_samples, config.vocab_size, recorded.tokenizer_vocab_size)
    info = universal_info(names, config.num_layers, target.pipeline_engine,
                          recorded.tokenizer_vocab_size or config.vocab_size, config.vocab_size, split_experts,
                          config.swiglu)
    tag_dir = os.path.join(out_dir, f"global_step{state.iteration}")
    universal = UniversalFiles(tag_dir, model, optimizer, config.num_layers, target.pipeline_engine, split_experts,
                               config.swiglu, progress)
    loss_scale = None if optimizer is None else target_loss_scale(
        precision, state.args, state.iteration, optimizer.loss_scale, RecordedFlags.of(state.args).precision)
    return _Writing(tag_dir, model, config.num_layers, target, state, optimizer, progress, precision, experts,
                    [name for name in names if name not in in_expert_files], split_experts, config.swiglu, client_args, info,
                    universal, loss_scale)


def _write_layer_files(writing: _Writing) -> None:
    """The pipeline engine's files: one per spec position and tensor-parallel rank."""
    names, num_layers, tp_size = list(writing.model), writing.num_layers, writing.target.tensor
    positions = positions_with_parameters(num_layers, OUTPUT_LAYER_WEIGHT in names)
    for index, position in enumerate(positions):
        piece = {spec_position(name, num_layers)[1]: name for name in names
                 if spec_position(name, num_layers)[0] == position}
        for tp in range(tp_size):
            writing.progress(f"writing piece {index + 1}/{len(positions)}, tensor-parallel shard {tp + 1}/{tp_size}")
            save(os.path.join(writing.tag_dir, layer_file(position, tp)),
                 writing.rank_tensors(piece, tp, False, held=False))


def _dense_zero0_optimizer(writing: _Writing, stage_names: List[str], mp_rank: int, tp: int) -> Optional[dict]:
    """A dense model's ZeRO-0 Adam state of one model-parallel rank: the mp_rank file's `optimizer`, or (None
    there) BF16_Optimizer's per-data-parallel-rank files, written here."""
    optimizer, num_layers, tp_size = writing.optimizer, writing.num_layers, writing.target.tensor
    groups, numel = _zero0_groups(stage_names, writing.universal, optimizer, num_layers, tp_size)

    def shard(kind: str, name: str) -> torch.Tensor:
        full_name = model_name(name, num_layers)
        return shard_of(full_name, optimizer.tensors(kind)[full_name], tp, tp_size, swiglu=writing.swiglu)
    if not writing.sliced:
        return zero0_state(groups, shard, optimizer.step, writing.loss_scale)
    for dp in range(writing.target.data):
        save(os.path.join(writing.tag_dir, optimizer_states_file(mp_rank, dp, True)),
             rank_slices(groups, shard, numel, optimizer.step, dp, writing.target.data))
    return None


def _write_expert_files(writing: _Writing, mp_rank: int, tp: int) -> None:
    """DeepSpeed's files of an MoE model's experts (whole or split as the flags recorded) and, with Adam state,
    its per-expert-parallel-rank ZeRO-0 files and, for target.data, its ZeRO 1-2 partitions."""
    target, optimizer, tp_size, split = writing.target, writing.optimizer, writing.target.tensor, writing.split_experts
    for (moe_layer, expert), expert_names in writing.experts.items():
        save(os.path.join(writing.tag_dir, expert_file(moe_layer, expert, mp_rank)),
             writing.rank_tensors({upstream_expert_key(name): name for name in expert_names}, tp, split, held=False))
    if optimizer is None:
        return
    moe_param_group = RecordedFlags.of(writing.state.args).moe_param_group
    for rank in range(target.expert):
        save(os.path.join(writing.tag_dir, expert_optimizer_file(rank, mp_rank)), rank_optimizer(
            writing.model, optimizer, moe_param_group, rank, target.expert, tp, tp_size, split, writing.loss_scale,
            writing.swiglu))
    for dp in range(target.data or 0):
        save(os.path.join(writing.tag_dir, optimizer_states_file(mp_rank, dp, writing.precision == "bf16")),
             rank_partitions(writing.model, optimizer, dp, target.data, target.expert, tp, tp_size, split,
                             writing.swiglu))


def _write_model_parallel_rank(writing: _Writing, stage_names: List[str], pp: int, tp: int) -> None:
    """One model-parallel rank's model-states file (the plain engine's module, the ZeRO-0 Adam state, the client
    state) and what belongs to that rank beside it."""
    target, state, tp_size = writing.target, writing.state, writing.target.tensor
    mp_rank = model_parallel_rank(pp, tp, tp_size)
    writing.progress(f"writing model-parallel rank {mp_rank + 1}/{tp_size * target.pipeline}")
    module = None if target.pipeline_engine else nest(  # PR-MoE's dense MLP split as its experts are
        writing.rank_tensors({name: name for name in writing.dense}, tp, writing.split_experts, held=True))
    dense_adam = writing.optimizer is not None and not writing.experts
    zero0 = _dense_zero0_optimizer(writing, stage_names, mp_rank, tp) if dense_adam else None
    client = build_client_state(writing.client_args, state.iteration, state.rng_state,
                                _tensor_parallel_rng(state, tp) if state.rng_state is not None else None, writing.info)
    client[UNIVERSAL_MARK] = True
    contents = {"module": module, "optimizer": zero0, **_deepspeed_bookkeeping(state, target), **client}
    if writing.experts:  # DeepSpeed reads the experts from their own files
        experts = writing.experts
        contents["num_experts"] = [sum(1 for layer, _ in experts if layer == moe_layer)
                                   for moe_layer in sorted({layer for layer, _ in experts})]
        _write_expert_files(writing, mp_rank, tp)
    contents.update({OPTIMIZER_PRECISION: writing.precision, OPTIMIZER_DATA_PARALLEL_SIZE: target.data})
    save(os.path.join(writing.tag_dir, model_states_file(mp_rank, 0)), contents)
    if not target.pipeline_engine:  # ZeRO 3 reads the client state under its own file name
        save(os.path.join(writing.tag_dir, model_states_file(mp_rank, 3)), {**contents, "module": None,
                                                                            "optimizer": None})


def _publish(out_dir: str, tag_dir: str, iteration: int) -> None:
    """The manifest, then the pointer files (a converter's output is complete once they name it)."""
    write_manifest(tag_dir)
    tag = os.path.basename(tag_dir)
    for name, text in ((LATEST_TAG_FILE, tag), (LATEST_UNIVERSAL_FILE, tag), (LATEST_ITERATION_FILE, str(iteration))):
        with open(os.path.join(out_dir, name), "w", encoding="utf-8") as handle:
            handle.write(text)


def write_checkpoint(out_dir: str, model: Mapping[str, torch.Tensor], config: GPTConfig, state: TrainingState,
                     target: TargetLayout, optimizer: Optional[OptimizerState] = None,
                     progress: Progress = quiet, precision: str = "fp32") -> str:
    """Write `model` (GPTModel's full state dict) and, unless None, `optimizer` into `out_dir` at `target`, its
    ZeRO-0 form (the mp_rank files' or a mixture-of-experts model's expp_rank files) for a run in `precision`
    (fp32, fp16, bf16). Returns the global_step directory."""
    writing = _prepare(out_dir, model, config, state, target, optimizer, progress, precision)
    if target.pipeline_engine:
        _write_layer_files(writing)
    for pp in range(target.pipeline):
        stage_names = engine_parameter_names(list(model), config.num_layers, target, pp)
        for tp in range(target.tensor):
            _write_model_parallel_rank(writing, stage_names, pp, tp)
    writing.universal.finish(RecordedFlags.of(state.args).clip_grad)
    _publish(out_dir, writing.tag_dir, state.iteration)
    return writing.tag_dir
