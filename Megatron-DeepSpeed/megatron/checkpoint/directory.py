"""A checkpoint directory's files and what they record, read in one CPU process (no torch.distributed): which
checkpoint a folder's pointer files name, its client state, the layout it was written at and the files that layout
needs (checkpoint/layout.py spells every name). The layouts a user may bring:

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
import dataclasses
import os
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional

import torch

from megatron.checkpoint import manifest, trust
from megatron.checkpoint.client_state import args_of
from megatron.checkpoint.layout import (ARGS, EXPERT_FILE_PATTERN, ITERATION, ITERATION_PATTERN,
                                        LATEST_ITERATION_FILE, LATEST_TAG_FILE, LATEST_UNIVERSAL_FILE, MEGATRON_FILE,
                                        MEGATRON_ITER_PATTERN, MEGATRON_MODEL, OPTIMIZER_SAVED, RELEASE, TAG_PATTERN, UNIVERSAL_DIR, UNIVERSAL_MARK,
                                        layer_file, megatron_iteration_dir, megatron_rank_dir, model_states_file,
                                        optimizer_states_file)
from megatron.checkpoint.names import positions_with_parameters, untied
from megatron.checkpoint.pointers import inside, quoted, read_pointer
from megatron.config.flags.moe import recorded_moe_config
from megatron.config.job import MoEConfig
from megatron.errors import InputError


@dataclass(frozen=True)
class Layout:
    """How the model was spread over processes when the checkpoint was written. A checkpoint written by
    writer.py (universal) fixes only the tensor- and pipeline-parallel sizes and the engine."""
    tensor: int
    pipeline: int
    data: Optional[int]  # None: any (universal)
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


# ----------------------------------------------------------------------------- files

def load_file(path: str, mmap: bool = True, meta: bool = False) -> dict:
    """The one torch.load of a checkpoint file: on the CPU, as data only (checkpoint/trust.py), memory-mapped
    unless `mmap` is False (tensors are read when used, so assembling a model holds about one copy of it), with
    an InputError naming the file when it is missing, truncated, not a torch file, or holds a type a checkpoint
    may not hold. A file in torch's legacy (non-zip) format cannot be memory-mapped: it is read whole. With
    `meta` (zip format only) its tensors are on the meta device, each storage marked with its offset in the file
    (tensor_records.py reads them from there)."""
    if not os.path.isfile(path):
        raise InputError(f"{path} is missing: the checkpoint in {os.path.dirname(path)} is incomplete; point at "
                         "a complete checkpoint (its 'latest' file names the newest complete one)")
    manifest.require_readable(path)
    try:
        return trust.torch_load(path, mmap=mmap and manifest.is_zip_archive(path), meta=meta)
    except Exception as err:  # torch raises RuntimeError, EOFError, UnpicklingError ... for a damaged file
        if trust.is_refusal(err):
            raise trust.refusal(path, trust.refused_type(err)) from None
        raise InputError(f"{path} cannot be read ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); "
                         "the file is truncated or damaged: copy it again or use another checkpoint") from err


def megatron_rank_file(tag_dir: str, tp_rank: int = 0, pp_rank: int = 0, pp_size: int = 1) -> str:
    return os.path.join(tag_dir, megatron_rank_dir(tp_rank, pp_rank, pp_size), MEGATRON_FILE)


def is_megatron_directory(tag_dir: str) -> bool:
    """Whether `tag_dir` is a Megatron-layout checkpoint (iter_N or release, holding mp_rank_XX[_YYY] folders)."""
    return any(os.path.isfile(os.path.join(tag_dir, name, MEGATRON_FILE)) for name in _listing(tag_dir)
               if name.startswith("mp_rank_"))


def _listing(directory: str) -> List[str]:
    return sorted(os.listdir(directory)) if os.path.isdir(directory) else []


def _first_model_states_file(tag_dir: str) -> str:
    if is_megatron_directory(tag_dir):
        first = [name for name in _listing(tag_dir) if name.startswith("mp_rank_00")][0]
        return os.path.join(tag_dir, first, MEGATRON_FILE)
    for name in (model_states_file(0, 0), model_states_file(0, 3)):
        if os.path.isfile(os.path.join(tag_dir, name)):
            return os.path.join(tag_dir, name)
    found = ", ".join(_listing(tag_dir)[:6]) or "nothing"
    raise InputError(f"{tag_dir} holds no {model_states_file(0, 0)} (nor {model_states_file(0, 3)}, nor "
                     f"mp_rank_00/{MEGATRON_FILE}): it holds {found}, which is no checkpoint layout this trainer "
                     "reads (DeepSpeed, DeepSpeed universal, Megatron), or it is incomplete")


def read_latest_iteration(directory: str) -> Optional[str]:
    """The Megatron checkpoint folder `directory`'s latest_checkpointed_iteration.txt names (iter_N or
    release); None when there is no such file."""
    path = os.path.join(directory, LATEST_ITERATION_FILE)
    text = read_pointer(directory, LATEST_ITERATION_FILE)
    if text is None:
        return None
    if text == RELEASE:
        return megatron_iteration_dir(0, release=True)
    if not ITERATION_PATTERN.fullmatch(text):
        raise InputError(f"{path} holds {quoted(text)}, neither an iteration number nor 'release'; write the "
                         "iteration of a complete checkpoint into it")
    inside(directory, megatron_iteration_dir(int(text)), path)
    return megatron_iteration_dir(int(text))


def checkpoint_directory(load_dir: str, iteration: Optional[int] = None, universal: bool = False) -> str:
    """The checkpoint directory to read: the one `latest` (with `universal`: `latest_universal`) names, or that
    of `iteration`; in a Megatron-layout folder the one latest_checkpointed_iteration.txt names. `load_dir` may
    also be such a directory itself."""
    if not os.path.isdir(load_dir):
        raise InputError(f"checkpoint directory {load_dir} does not exist; give the --save directory of a run")
    if not os.access(load_dir, os.R_OK | os.X_OK):
        raise InputError(f"checkpoint directory {load_dir} cannot be listed (permission denied for this user); fix "
                         f"its permissions, or point at a checkpoint this user can read")
    base = os.path.basename(os.path.normpath(load_dir))
    if iteration is None and (TAG_PATTERN.match(base) or MEGATRON_ITER_PATTERN.fullmatch(base) or base == RELEASE
                              or os.path.isdir(os.path.join(load_dir, UNIVERSAL_DIR))):
        _first_model_states_file(load_dir)
        return load_dir
    if iteration is not None:
        for name in (f"global_step{iteration}", megatron_iteration_dir(iteration)):
            if os.path.isdir(os.path.join(load_dir, name)):
                return inside(load_dir, name, f"--iteration {iteration}")
        raise InputError(f"{load_dir} has no checkpoint of iteration {iteration} "
                         f"({os.path.join(load_dir, f'global_step{iteration}')} does not exist); "
                         f"it has: {', '.join(available_tags(load_dir)) or 'none'}")
    tag = read_latest_tag(load_dir, LATEST_UNIVERSAL_FILE if universal else LATEST_TAG_FILE)
    if tag is None and not universal:  # a folder of DeepSpeed's ds_to_universal, or of the Megatron layout
        tag = read_latest_tag(load_dir, LATEST_UNIVERSAL_FILE) or read_latest_iteration(load_dir)
    if tag is None:
        tags = available_tags(load_dir)
        pointer = LATEST_UNIVERSAL_FILE if universal else f"'{LATEST_TAG_FILE}' (nor {LATEST_ITERATION_FILE})"
        hint = (f"it has {', '.join(tags)} but no {pointer} file: pass --iteration N" if tags else
                f"it holds {', '.join(_listing(load_dir)[:6]) or 'nothing'}; give the --save directory of a "
                "training run")
        raise InputError(f"{load_dir} is not a checkpoint directory: {hint}")
    tag_dir = os.path.join(load_dir, tag)
    if not os.path.isdir(tag_dir):
        raise InputError(f"{load_dir}'s pointer file names checkpoint '{tag}', but {tag_dir} does not exist; pass "
                         f"--iteration N for one that does ({', '.join(available_tags(load_dir)) or 'none found'})")
    return tag_dir


def read_latest_tag(directory: str, pointer: str = LATEST_TAG_FILE) -> Optional[str]:
    """The checkpoint name `directory`'s `latest` file (or `pointer`) holds; None when there is none. One that
    cannot be read, holds no name like 'global_step1000' (a name, never a path), or names a directory that
    leads outside `directory`, is an InputError naming the file (checkpoint/pointers.py)."""
    path = os.path.join(directory, pointer)
    tag = read_pointer(directory, pointer)
    if tag is None:
        return None
    if not TAG_PATTERN.fullmatch(tag):
        raise InputError(f"{path} holds {quoted(tag)}, not a checkpoint name like 'global_step1000'; write the "
                         f"name of a complete checkpoint directory into it")
    inside(directory, tag, path)
    return tag


def available_tags(load_dir: str) -> List[str]:
    tags = [name for name in os.listdir(load_dir) if (TAG_PATTERN.match(name) or MEGATRON_ITER_PATTERN.fullmatch(name))
            and os.path.isdir(os.path.join(load_dir, name))]
    return sorted(tags, key=lambda tag: int((TAG_PATTERN.match(tag) or MEGATRON_ITER_PATTERN.fullmatch(tag)).group(1)))


# ----------------------------------------------------------------------------- metadata

def read_client_state(tag_dir: str, verify: bool = True, whole: bool = True, optimizer: bool = True) -> dict:
    """The first model-parallel rank's model-states file (a Megatron checkpoint's first rank file): DeepSpeed's
    bookkeeping plus the client state, `args` as a dict whichever way it was saved. With `verify`, every file of
    the checkpoint is checked first: against its manifest, or without one, the files its layout needs. Not
    `whole` (a reader of one tensor-parallel shard): only the files present are checked, each one read names
    itself if it is missing. Without `optimizer` (a weights-only load) optimizer partitions may be missing."""
    verified = verify and manifest.check_manifest(tag_dir, whole, optimizer)
    path = _first_model_states_file(tag_dir)
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


def layout_files(state: Mapping[str, object], tag_dir: str) -> Dict[str, Optional[str]]:
    """The files a checkpoint of this client state consists of, each with the key it must hold (None: any)."""
    layout, args = layout_of(state, tag_dir), state[ARGS]
    model_ranks = range(layout.tensor * layout.pipeline)
    if layout.megatron:
        return {os.path.join(megatron_rank_dir(tp, pp, layout.pipeline), MEGATRON_FILE): MEGATRON_MODEL
                for pp in range(layout.pipeline) for tp in range(layout.tensor)}
    has_pieces = any(name.startswith("layer_") for name in os.listdir(tag_dir))
    if layout.pipeline_engine and not has_pieces and os.path.isdir(os.path.join(tag_dir, UNIVERSAL_DIR)):
        return {model_states_file(0, 0): "module"}  # DeepSpeed's ds_to_universal: the weights are in zero/
    data_ranks = range(layout.data or 1)
    if layout.zero_stage == 3:
        files = {model_states_file(mp, 3, dp): "module" for mp in model_ranks for dp in data_ranks}
    else:
        files = {model_states_file(mp, 0): "module" for mp in model_ranks}
    num_layers = int(args["num_layers"])
    old = os.path.isfile(os.path.join(tag_dir, layer_file(0, 0)))  # earlier versions numbered pieces from 0
    if layout.pipeline_engine:
        positions = range(num_layers + 2) if old else positions_with_parameters(num_layers, untied(args))
        files.update({layer_file(position, tp): None for position in positions for tp in range(layout.tensor)})
    moe = any(EXPERT_FILE_PATTERN.fullmatch(name) for name in os.listdir(tag_dir))  # DeepSpeed names its files
    if not (layout.universal or moe) and state.get(OPTIMIZER_SAVED, True) and (layout.zero_stage or args.get("bf16")):
        files.update({optimizer_states_file(mp, dp, bool(args.get("bf16"))): "optimizer_state_dict"
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


def pipeline_engine_of(args: Mapping[str, object]) -> bool:
    """Whether flags `args` ran DeepSpeed's pipeline engine (upstream's default) or its plain engine."""
    return bool(args.get("ds_pipeline_enabled", not args.get("no_pipeline_parallel")))


def layout_of(state: Mapping[str, object], tag_dir: Optional[str] = None) -> Layout:
    """The layout a checkpoint's client state (of read_client_state) records; a universal checkpoint (our
    writer's mark, or a zero/ folder of per-parameter state in `tag_dir`) fixes no DP size or ZeRO stage."""
    args = state[ARGS]
    megatron = tag_dir is not None and is_megatron_directory(tag_dir)
    universal = bool(state.get(UNIVERSAL_MARK)) or megatron or (
        tag_dir is not None and os.path.isdir(os.path.join(tag_dir, UNIVERSAL_DIR)))
    return Layout(tensor=int(args["tensor_model_parallel_size"]), pipeline=int(args["pipeline_model_parallel_size"]),
                  data=None if universal else int(args["data_parallel_size"]),
                  zero_stage=None if universal else int(args["zero_stage"]),
                  pipeline_engine=pipeline_engine_of(args), megatron=megatron)


def precision_of(args: Mapping[str, object]) -> str:
    """The precision recorded flags train in: fp16, bf16 or fp32."""
    return "fp16" if args.get("fp16") else "bf16" if args.get("bf16") else "fp32"


def training_dtype(args: Mapping[str, object]) -> torch.dtype:
    return {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[precision_of(args)]


def experts_split(args: Mapping[str, object]) -> bool:
    """Whether a checkpoint's recorded flags split its experts, and PR-MoE's dense MLP beside them, over the
    tensor-parallel ranks (--enable-expert-tensor-parallelism; at tensor-parallel size 1 nothing is split)."""
    return recorded_moe_config(args).expert_tensor_parallel


def whole_model_moe(args: Mapping[str, object]) -> Optional[MoEConfig]:
    """The MoE section of a checkpoint's recorded flags, for a model holding every expert whole (expert-parallel
    size 1, experts not split over tensor-parallel ranks); None for a dense model."""
    moe = recorded_moe_config(args)
    return dataclasses.replace(moe, expert_parallel_size=1, expert_tensor_parallel=False) if moe.enabled else None
