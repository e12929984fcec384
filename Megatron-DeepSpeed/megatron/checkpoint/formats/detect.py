"""What a checkpoint directory holds, decided once, in one CPU process (no torch.distributed): its client state, the
layout it was written at (Layout), where its weights are (weights_kind: one of KINDS, each read by one module of
formats/, reader.WEIGHT_UNITS looks it up) and the files that layout needs (file_names.py spells every name). The
layouts a user may bring:

  DeepSpeed (ours, upstream Megatron-DeepSpeed's, and those earlier versions of this project wrote), for
  TP x PP x DP and model-parallel rank mp = pp_rank * TP + tp_rank:
    DIR/latest                      the tag of the newest complete checkpoint, e.g. global_step500
    DIR/global_step500/
      pipeline engine:  layer_{NN}-model_{tp:02d}-model_states.pt   one spec position's weights (embedding 01,
                        layers 03..L+2, final LayerNorm L+4; earlier versions numbered 00, 01..L, L+1)
                        mp_rank_{mp:02d}_model_states.pt            client state (module is None)
      plain engine:     mp_rank_{mp:02d}_model_states.pt            client state + module (nested as upstream's
                        GPTModel nests it; flat GPTModel names in earlier versions)
      MoE (plain):      layer_{i}_expert_{e}_mp_rank_{mp:02d}_model_states.pt   one expert's weights under
                        MoEGPTModel's names (the trainer's) or upstream's GPTModel's (the converter's), with the
                        global expert index (the module holds the rest)
      ZeRO 1/2:         zero_pp_rank_{dp}_mp_rank_{mp:02d}_optim_states.pt  flat fp32 and Adam partitions
      ZeRO 3:           zero_pp_rank_{dp}_mp_rank_{mp:02d}_model_states.pt  client state, empty module
                        zero_pp_rank_{dp}_mp_rank_{mp:02d}_optim_states.pt  flat fp32 partitions: the weights
  DeepSpeed universal (ds_to_universal's output, `latest_universal`): zero/<engine parameter name>/fp32.pt
    full tensors (vocabulary padding stripped) beside the mp_rank files.
  Megatron (upstream's deepspeed_to_megatron.py, Megatron-LM): DIR/latest_checkpointed_iteration.txt (N or
    'release') and iter_{N:07d}/mp_rank_{tp:02d}[_{pp:03d}]/model_optim_rng.pt, the model nested under
    `model`, each pipeline stage numbering its layers from 0.
The client state (checkpoint/client_state.py) holds iteration, the flags (consumed samples among them) and RNG
states.
"""
import os
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional

from megatron.checkpoint import manifest
from megatron.checkpoint.client_state import args_of, halves_gate_and_up
from megatron.checkpoint.file_names import (ARGS, EXPERT_FILE_PATTERN, ITERATION, MEGATRON_FILE, MEGATRON_MODEL,
                                            OPTIMIZER_SAVED, UNIVERSAL_DIR, UNIVERSAL_MARK, layer_file,
                                            megatron_rank_dir, model_states_file, optimizer_states_file)
from megatron.checkpoint.parameter_names import positions_with_parameters
from megatron.config.recorded_flags import RecordedFlags
from megatron.checkpoint.shards import HALVES, INTERLEAVED
from megatron.checkpoint.torch_files import load_file
from megatron.errors import InputError

# Where a checkpoint's weights are (weights_kind): one kind per source format, each read by one module of formats/.
MEGATRON = "megatron"  # Megatron's layout: iter_N/mp_rank_XX[_YYY]/model_optim_rng.pt
UNIVERSAL_FILES = "universal files"  # DeepSpeed's ds_to_universal: zero/<parameter>/fp32.pt, no engine weights
PIPELINE = "pipeline engine"  # one file per spec position and tensor-parallel rank, numbered as upstream's
PIPELINE_FROM_ZERO = "pipeline engine, numbered from 0"  # the same, as earlier versions numbered them (layer_00)
PLAIN = "plain engine"  # the module in each model-states file (its experts in expert files)
ZERO3 = "ZeRO 3"  # the weights are the flat fp32 partitions of the optimizer files
KINDS = (MEGATRON, UNIVERSAL_FILES, PIPELINE, PIPELINE_FROM_ZERO, PLAIN, ZERO3)


@dataclass(frozen=True)
class Layout:
    """How the model was spread over processes when the checkpoint was written. A checkpoint written by
    convert/target_writer.py (universal) fixes only the tensor- and pipeline-parallel sizes and the engine."""
    tensor: int
    pipeline: int
    data: Optional[int]  # ZeRO's partitions: data- x Ulysses sequence-parallel ranks; None: any (universal)
    zero_stage: Optional[int]  # None: any (universal)
    pipeline_engine: bool  # DeepSpeed's pipeline engine (one file per piece) or its plain engine
    megatron: bool = False  # Megatron's layout (iter_N/mp_rank_XX/model_optim_rng.pt): weights, no engine state

    @property
    def universal(self) -> bool:
        return self.data is None and not self.megatron

    def describe(self) -> str:
        engine = "pipeline engine" if self.pipeline_engine else "plain engine (--no-pipeline-parallel)"
        if self.megatron:
            return f"Megatron layout, TP {self.tensor} x PP {self.pipeline}"
        if self.universal:
            return f"TP {self.tensor} x PP {self.pipeline}, any DP and ZeRO stage, {engine}"
        return (f"TP {self.tensor} x PP {self.pipeline} x DP {self.data}, ZeRO stage {self.zero_stage}, "
                f"{engine}")


def megatron_rank_file(tag_dir: str, tp_rank: int = 0, pp_rank: int = 0, pp_size: int = 1) -> str:
    return os.path.join(tag_dir, megatron_rank_dir(tp_rank, pp_rank, pp_size), MEGATRON_FILE)


def is_megatron_directory(tag_dir: str) -> bool:
    """Whether `tag_dir` is a Megatron-layout checkpoint (iter_N or release, holding mp_rank_XX[_YYY] folders)."""
    return any(os.path.isfile(os.path.join(tag_dir, name, MEGATRON_FILE)) for name in listing(tag_dir)
               if name.startswith("mp_rank_"))


def listing(directory: str) -> List[str]:
    return sorted(os.listdir(directory)) if os.path.isdir(directory) else []


def first_model_states_file(tag_dir: str) -> str:
    if is_megatron_directory(tag_dir):
        first = [name for name in listing(tag_dir) if name.startswith("mp_rank_00")][0]
        return os.path.join(tag_dir, first, MEGATRON_FILE)
    for name in (model_states_file(0, 0), model_states_file(0, 3)):
        if os.path.isfile(os.path.join(tag_dir, name)):
            return os.path.join(tag_dir, name)
    found = ", ".join(listing(tag_dir)[:6]) or "nothing"
    raise InputError(f"{tag_dir} holds no {model_states_file(0, 0)} (nor {model_states_file(0, 3)}, nor "
                     f"mp_rank_00/{MEGATRON_FILE}): it holds {found}, which is no checkpoint layout this trainer "
                     "reads (DeepSpeed, DeepSpeed universal, Megatron), or it is incomplete")


def read_client_state(tag_dir: str, verify: bool = True, whole: bool = True, optimizer: bool = True) -> dict:
    """The first model-parallel rank's model-states file (a Megatron checkpoint's first rank file): DeepSpeed's
    bookkeeping plus the client state, `args` as a dict whichever way it was saved. With `verify`, every file of
    the checkpoint is checked first: against its manifest, or without one, the files its layout needs. Not
    `whole` (a reader of one tensor-parallel shard): only the files present are checked, each one read names
    itself if it is missing. Without `optimizer` (a weights-only load) optimizer partitions may be missing."""
    verified = verify and manifest.check_manifest(tag_dir, whole, optimizer)
    path = first_model_states_file(tag_dir)
    if verify and not verified:
        manifest.check_torch_file(path)
    state = load_file(path)
    if not isinstance(state, dict) or ARGS not in state or ITERATION not in state:
        found = ", ".join(sorted(state)[:8]) if isinstance(state, dict) else type(state).__name__
        raise InputError(f"{path} carries no trainer state (iteration, args) but {found}: it was not written by "
                         "pretrain_gpt.py, upstream Megatron-DeepSpeed or Megatron")
    state = {**state, ARGS: args_of(state)}
    if verify and whole and not verified:
        check_layout_files(tag_dir, state, optimizer)
    return state


def gate_up_rows(tag_dir: str, state: Mapping[str, object]) -> Optional[str]:
    """How the --swiglu checkpoint in `tag_dir` (client state `state`) holds dense_h_to_4h's rows: HALVES, each
    tensor-parallel rank's [gate_r; up_r], where its client state declares them to DeepSpeed as
    PARAMETER_WITH_2_SUB_PARAMS_CAT_DIM_0 (upstream main's and ours since) or in Megatron's layout (Megatron-LM's and
    upstream's converters cut them so); otherwise INTERLEAVED, [ffn, (gate, up)] (this project's before). None
    without --swiglu."""
    if not state[ARGS].get("swiglu"):
        return None
    return HALVES if halves_gate_and_up(state) or is_megatron_directory(tag_dir) else INTERLEAVED


def weights_kind(tag_dir: str, state: Mapping[str, object], layout: Layout) -> str:
    """The one decision of where the weights of the checkpoint in `tag_dir` (client state `state`, layout
    `layout`) are: one of KINDS. Every reader of the weights or of the files a layout needs asks this."""
    if layout.megatron:
        return MEGATRON
    if layout.pipeline_engine:
        if os.path.isfile(os.path.join(tag_dir, layer_file(0, 0))):
            return PIPELINE_FROM_ZERO
        has_pieces = any(name.startswith("layer_") for name in listing(tag_dir))
        universal_files = os.path.isdir(os.path.join(tag_dir, UNIVERSAL_DIR))
        return UNIVERSAL_FILES if universal_files and not has_pieces else PIPELINE
    if state.get("module") is None and layout.universal:  # ds_to_universal copies the model-states files only
        return UNIVERSAL_FILES
    return ZERO3 if layout.zero_stage == 3 else PLAIN


def pipeline_positions(kind: str, flags: RecordedFlags) -> List[int]:
    """The spec positions that have a layer file in a pipeline-engine checkpoint of `kind`."""
    if kind == PIPELINE_FROM_ZERO:  # embedding 0, layers 1..L, final LayerNorm L+1
        return list(range(flags.num_layers + 2))
    return positions_with_parameters(flags.num_layers, flags.untied)


def layout_files(state: Mapping[str, object], tag_dir: str) -> Dict[str, Optional[str]]:
    """The files a checkpoint of this client state consists of, each with the key it must hold (None: any)."""
    layout, flags = layout_of(state, tag_dir), RecordedFlags.of(state[ARGS])
    kind = weights_kind(tag_dir, state, layout)
    model_ranks = range(layout.tensor * layout.pipeline)
    if kind == MEGATRON:
        return {os.path.join(megatron_rank_dir(tp, pp, layout.pipeline), MEGATRON_FILE): MEGATRON_MODEL
                for pp in range(layout.pipeline) for tp in range(layout.tensor)}
    if kind == UNIVERSAL_FILES:
        return {model_states_file(0, 0): "module"}  # DeepSpeed's ds_to_universal: the weights are in zero/
    data_ranks = range(layout.data or 1)
    if layout.zero_stage == 3:
        files = {model_states_file(mp, 3, dp): "module" for mp in model_ranks for dp in data_ranks}
    else:
        files = {model_states_file(mp, 0): "module" for mp in model_ranks}
    if kind in (PIPELINE, PIPELINE_FROM_ZERO):
        files.update({layer_file(position, tp): None for position in pipeline_positions(kind, flags)
                      for tp in range(layout.tensor)})
    moe = any(EXPERT_FILE_PATTERN.fullmatch(name) for name in os.listdir(tag_dir))  # DeepSpeed names its files
    if not (layout.universal or moe) and state.get(OPTIMIZER_SAVED, True) and (layout.zero_stage or flags.bf16):
        files.update({optimizer_states_file(mp, dp, flags.bf16): "optimizer_state_dict"
                      for mp in model_ranks for dp in data_ranks})
    return files


def check_layout_files(tag_dir: str, state: Mapping[str, object], optimizer: bool = True) -> None:
    """A checkpoint without a manifest: each file its layout needs exists, is whole and holds what its name
    says (an InputError naming the first that does not)."""
    for name, key in layout_files(state, tag_dir).items():
        if not optimizer and name.endswith(manifest.OPTIMIZER_FILE_END):
            continue
        path = os.path.join(tag_dir, name)
        manifest.check_torch_file(path)
        contents = load_file(path)
        if not isinstance(contents, dict) or (key is not None and key not in contents):
            what = f"no '{key}' entry" if isinstance(contents, dict) else f"a {type(contents).__name__}"
            raise InputError(f"checkpoint file {path} holds {what}, not what a DeepSpeed file of that name holds: it "
                             "was replaced or written by another program; restore it from the checkpoint's source")


def holds_optimizer_state(tag_dir: str, state: Mapping[str, object]) -> bool:
    """Whether the checkpoint in tag_dir (client state `state`) carries the optimizer's state."""
    if not state.get(OPTIMIZER_SAVED, True) or is_megatron_directory(tag_dir):
        return False
    universal = os.path.join(tag_dir, UNIVERSAL_DIR)
    if not os.path.isdir(universal):
        return True
    return any(os.path.isfile(os.path.join(universal, entry, "exp_avg.pt")) for entry in os.listdir(universal))


def layout_of(state: Mapping[str, object], tag_dir: Optional[str] = None) -> Layout:
    """The layout a checkpoint's client state (of read_client_state) records; a universal checkpoint (our
    writer's mark, or a zero/ folder of per-parameter state in `tag_dir`) fixes no DP size or ZeRO stage."""
    flags = RecordedFlags.of(state[ARGS])
    megatron = tag_dir is not None and is_megatron_directory(tag_dir)
    universal = bool(state.get(UNIVERSAL_MARK)) or megatron or (
        tag_dir is not None and os.path.isdir(os.path.join(tag_dir, UNIVERSAL_DIR)))
    return Layout(tensor=flags.tensor_parallel, pipeline=flags.pipeline_parallel,
                  data=None if universal else flags.zero_partitions, zero_stage=None if universal else flags.zero_stage,
                  pipeline_engine=flags.pipeline_engine, megatron=megatron)
