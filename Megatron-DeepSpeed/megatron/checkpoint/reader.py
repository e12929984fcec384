"""Read a checkpoint of any layout a user brings, in one CPU process (no torch.distributed): the layout is
recognised from the files (checkpoint/layout.py names them all).

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
                        MoEGPTModel's names with the global expert index (the module holds the rest)
      ZeRO 1/2:         zero_pp_rank_{dp}_mp_rank_{mp:02d}_optim_states.pt  flat fp32 and Adam partitions
      ZeRO 3:           zero_pp_rank_{dp}_mp_rank_{mp:02d}_model_states.pt  client state, empty module
                        zero_pp_rank_{dp}_mp_rank_{mp:02d}_optim_states.pt  flat fp32 partitions: the weights
  DeepSpeed universal (ds_to_universal's output, `latest_universal`): zero/<engine parameter name>/fp32.pt
    full tensors (vocabulary padding stripped) beside the mp_rank files.
  Megatron (upstream's deepspeed_to_megatron.py, Megatron-LM): DIR/latest_checkpointed_iteration.txt (N or
    'release') and iter_{N:07d}/mp_rank_{tp:02d}[_{pp:03d}]/model_optim_rng.pt, the model nested under
    `model`, each pipeline stage numbering its layers from 0.
The client state (checkpoint/client_state.py) holds iteration, the flags (consumed samples among them) and RNG
states. Tensor-parallel shards are joined (shards.shard_from_shards) into full tensors, or cut straight into one
target rank's shards (TensorShard) reading only the files and ranges it overlaps; the result is keyed by the
single-process GPTModel's parameter names, the tied word embedding once.
"""
import dataclasses
import os
from collections import abc
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Dict, Hashable, Iterator, List, Mapping, Optional, Sequence, Tuple

import torch

from megatron.checkpoint import manifest, trust
from megatron.checkpoint.client_state import args_of, is_current, recorded_consumed_samples
from megatron.checkpoint.layout import (ARGS, EXPERT_FILE_PATTERN, ITERATION, LATEST_ITERATION_FILE, LATEST_TAG_FILE,
                                        LATEST_UNIVERSAL_FILE, MEGATRON_FILE, MEGATRON_ITER_PATTERN, MEGATRON_MODEL,
                                        OPTIMIZER_SAVED, RELEASE, TAG_PATTERN,
                                        UNIVERSAL_DIR, UNIVERSAL_MARK, layer_file, megatron_iteration_dir,
                                        megatron_rank_dir, model_states_file, optimizer_states_file)
from megatron.checkpoint.names import (LAYERS_PREFIX, WORD_EMBEDDINGS, current_name, flatten, is_nested, model_name,
                                       name_at_position, nest, old_position_name, positions_with_parameters,
                                       spec_position)
from megatron.checkpoint.shards import join_shards, overlapping_ranks, shard_from_shards
from megatron.config.flags.moe import recorded_moe_config
from megatron.config.job import MoEConfig
from megatron.config.model_config import ModelConfig
from megatron.errors import InputError

Progress = Callable[[str], None]


def _quiet(_message: str) -> None:
    pass


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


@dataclass(frozen=True)
class Checkpoint:
    directory: str  # the global_step{N} directory read
    iteration: int
    consumed_train_samples: int
    args: Mapping[str, object]  # the flags of the run that wrote it (plain values)
    layout: Layout
    padded_vocab_size: int
    model: Mapping[str, torch.Tensor]  # full tensors (or a TensorShard's) under GPTModel's names, training dtype
    has_optimizer_state: bool  # False: saved with --no-save-optim, or converted with --weights-only
    old: bool = False  # written by an earlier version of this project (pipeline pieces numbered from 0)

    @property
    def model_config(self) -> ModelConfig:
        """The model the recorded flags describe (dropout and activation checkpointing as trained)."""
        return ModelConfig.from_flags(self.args, f"the flags recorded in {self.directory}")

    @property
    def moe(self) -> Optional[MoEConfig]:
        """Its mixture of experts as a single process holds them all (None: dense)."""
        return whole_model_moe(self.args)


# ----------------------------------------------------------------------------- files

def load_file(path: str, mmap: bool = True) -> dict:
    """The one torch.load of a checkpoint file: on the CPU, as data only (checkpoint/trust.py), memory-mapped
    unless `mmap` is False (tensors are read when used, so assembling a model holds about one copy of it), with
    an InputError naming the file when it is missing, truncated, not a torch file, or holds a type a checkpoint
    may not hold. A file in torch's legacy (non-zip) format cannot be memory-mapped: it is read whole."""
    if not os.path.isfile(path):
        raise InputError(f"{path} is missing: the checkpoint in {os.path.dirname(path)} is incomplete; point at "
                         "a complete checkpoint (its 'latest' file names the newest complete one)")
    try:
        return trust.torch_load(path, mmap=mmap and manifest.is_zip_archive(path))
    except Exception as err:  # torch raises RuntimeError, EOFError, UnpicklingError ... for a damaged file
        if trust.is_refusal(err):
            raise trust.refusal(path, trust.refused_type(err)) from None
        raise InputError(f"{path} cannot be read ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); "
                         "the file is truncated or damaged: copy it again or use another checkpoint") from err


def _megatron_rank_file(tag_dir: str, tp_rank: int = 0, pp_rank: int = 0, pp_size: int = 1) -> str:
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
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as handle:
        text = handle.read().strip()
    if text == RELEASE:
        return megatron_iteration_dir(0, release=True)
    if not text.isdigit():
        raise InputError(f"{path} holds {text!r}, neither an iteration number nor 'release'; write the iteration "
                         "of a complete checkpoint into it")
    return megatron_iteration_dir(int(text))


def checkpoint_directory(load_dir: str, iteration: Optional[int] = None, universal: bool = False) -> str:
    """The checkpoint directory to read: the one `latest` (with `universal`: `latest_universal`) names, or that
    of `iteration`; in a Megatron-layout folder the one latest_checkpointed_iteration.txt names. `load_dir` may
    also be such a directory itself."""
    if not os.path.isdir(load_dir):
        raise InputError(f"checkpoint directory {load_dir} does not exist; give the --save directory of a run")
    base = os.path.basename(os.path.normpath(load_dir))
    if iteration is None and (TAG_PATTERN.match(base) or MEGATRON_ITER_PATTERN.fullmatch(base) or base == RELEASE
                              or os.path.isdir(os.path.join(load_dir, UNIVERSAL_DIR))):
        _first_model_states_file(load_dir)
        return load_dir
    if iteration is not None:
        for name in (f"global_step{iteration}", megatron_iteration_dir(iteration)):
            if os.path.isdir(os.path.join(load_dir, name)):
                return os.path.join(load_dir, name)
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
    cannot be read, or holds no name like 'global_step1000', is an InputError naming the file."""
    path = os.path.join(directory, pointer)
    if not os.path.lexists(path):
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            tag = handle.read().strip()
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"{path} cannot be read ({getattr(err, 'strerror', None) or err}); it names the "
                         f"checkpoint to resume: restore it, or point --load elsewhere") from err
    if not TAG_PATTERN.match(tag):
        raise InputError(f"{path} holds {tag!r}, not a checkpoint name like 'global_step1000'; write the name "
                         f"of a complete checkpoint directory into it")
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
        positions = range(num_layers + 2) if old else positions_with_parameters(num_layers)
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


def training_dtype(args: Mapping[str, object]) -> torch.dtype:
    return torch.float16 if args.get("fp16") else torch.bfloat16 if args.get("bf16") else torch.float32


def whole_model_moe(args: Mapping[str, object]) -> Optional[MoEConfig]:
    """The MoE section of a checkpoint's recorded flags, for a model holding every expert whole (expert-parallel
    size 1, experts not split over tensor-parallel ranks); None for a dense model."""
    moe = recorded_moe_config(args)
    return dataclasses.replace(moe, expert_parallel_size=1, expert_tensor_parallel=False) if moe.enabled else None


# ----------------------------------------------------------------------------- weights

@dataclass(frozen=True)
class TensorShard:
    """Which part of each tensor read_checkpoint assembles: target tensor-parallel rank `rank` of `size` (the
    whole tensor: rank 0 of 1). Only the source files and ranges that part overlaps are read, so a rank of
    a generation or evaluation job holds its shard, never the whole model."""
    rank: int = 0
    size: int = 1

    def sources(self, source_size: int) -> List[int]:
        return overlapping_ranks(source_size, self.rank, self.size)

    def assemble(self, name: str, shards: Dict[int, torch.Tensor], source_size: int) -> torch.Tensor:
        """A shard comes as its own copy, so each file's memory map can close after its piece and the pages
        read count once; whole tensors stay as read (views into the maps where nothing was joined)."""
        part = shard_from_shards(name, shards, source_size, self.rank, self.size)
        return part if self.size == 1 else part.clone()


WHOLE = TensorShard()


def _assembled(part: TensorShard, shards: Dict[int, Mapping[str, torch.Tensor]], source_size: int, key: str,
               name: str) -> torch.Tensor:
    """`part` of tensor `name`, stored under `key` in the source shards (state dicts by source rank)."""
    return part.assemble(name, {tp: shard[key] for tp, shard in shards.items()}, source_size)


@dataclass(frozen=True)
class Units:
    """A layout's weights as units read one at a time: the unit of each GPTModel name (in the order the whole
    model lists them) and how to read one unit's tensors. A unit is a model piece (embedding, one layer, the
    final LayerNorm) of one set of memory-mapped files, an expert file, or, for a file in torch's legacy
    (non-zip) format, which cannot be memory-mapped, the whole file set (read whole, one set at a time)."""
    of: Dict[str, Hashable]
    read: Callable[[Hashable], Dict[str, torch.Tensor]]


def names_in(of: Mapping[str, Hashable], unit: Hashable) -> List[str]:
    return [name for name, its in of.items() if its == unit]


def piece_unit(mappable: bool, files: Hashable, name: str, num_layers: int) -> Hashable:
    """The unit of GPTModel parameter `name` in the file set `files`: its model piece, or the whole set."""
    return (files, spec_position(name, num_layers)[0]) if mappable else (files,)


def all_mappable(paths) -> bool:
    return all(manifest.is_zip_archive(path) for path in paths)


def _joined(first: Units, second: Units) -> Units:
    """Both sets of units, the second's names added after (or over) the first's."""
    of = {name: (0, unit) for name, unit in first.of.items()}
    of.update((name, (1, unit)) for name, unit in second.of.items())
    return Units(of, lambda unit: (first, second)[unit[0]].read(unit[1]))


def _read_whole(units: Units, progress: Progress) -> dict:
    """Every unit read once, in order: the whole model (or a TensorShard's part of it) in memory."""
    order = list(dict.fromkeys(units.of.values()))
    model = {}
    for index, unit in enumerate(order):
        progress(f"reading part {index + 1}/{len(order)} of the weights")
        model.update(units.read(unit))
    return {name: model[name] for name in units.of}


class StreamedWeights(abc.Mapping):
    """A checkpoint's weights read one unit (Units) at a time when asked for, only the last unit kept: a
    converter writing one target file at a time then holds that file and one source piece, never the whole
    model (the tensors are those read whole, so what is written stays the same)."""

    def __init__(self, units: Units):
        self._units = units
        self._unit: Tuple[Optional[Hashable], dict] = (None, {})

    def __getitem__(self, name: str) -> torch.Tensor:
        unit = self._units.of[name]
        if self._unit[0] != unit:
            self._unit = (None, {})  # drop the last unit before reading the next
            self._unit = (unit, self._units.read(unit))
        return self._unit[1][name]

    def __contains__(self, name: object) -> bool:  # without reading the unit, as Mapping's default would
        return name in self._units.of

    def __iter__(self) -> Iterator[str]:
        return iter(self._units.of)

    def __len__(self) -> int:
        return len(self._units.of)


# --- DeepSpeed's pipeline engine: one file per piece and tensor-parallel rank

def _pipeline_positions(tag_dir: str, num_layers: int) -> Tuple[bool, Sequence[int]]:
    """Whether the layer files are numbered as earlier versions of this project numbered them (embedding
    layer_00), and the spec positions that have a file."""
    old = os.path.isfile(os.path.join(tag_dir, layer_file(0, 0)))
    return old, range(num_layers + 2) if old else positions_with_parameters(num_layers)


def _piece_weights(tag_dir: str, layout: Layout, num_layers: int, old: bool, position: int,
                   part: TensorShard) -> dict:
    """`part` of each tensor of the piece at spec `position`, under GPTModel's names."""
    shards = {tp: load_file(os.path.join(tag_dir, layer_file(position, tp))) for tp in part.sources(layout.tensor)}
    names = {key: _piece_name(old, position, key, num_layers) for key in shards[min(shards)]}
    return {name: _assembled(part, shards, layout.tensor, key, name) for key, name in names.items()}


def _piece_name(old: bool, position: int, key: str, num_layers: int) -> str:
    return (old_position_name if old else name_at_position)(position, key, num_layers)


def _pipeline_engine_units(tag_dir: str, layout: Layout, num_layers: int, part: TensorShard) -> Units:
    """The layer files: numbered as upstream's (model/pipe.py), or as earlier versions of this project numbered
    them (embedding layer_00); a piece's keys are read from the pickle, not its tensors."""
    old, positions = _pipeline_positions(tag_dir, num_layers)
    source = part.sources(layout.tensor)[0]
    of = {_piece_name(old, position, key, num_layers): position for position in positions
          for key in load_file(os.path.join(tag_dir, layer_file(position, source)))}
    return Units(of, lambda position: _piece_weights(tag_dir, layout, num_layers, old, position, part))


# --- DeepSpeed's plain engine: the whole module in each tensor-parallel rank's model-states file

def _module_names(module: Mapping[str, object]) -> Dict[str, torch.Tensor]:
    """A plain engine's `module` under GPTModel's names: nested as upstream's, or flat as earlier versions."""
    return flatten(module) if is_nested(module) else flatten(nest(module))


def _plain_engine_units(tag_dir: str, layout: Layout, num_layers: int, part: TensorShard) -> Units:
    paths = {tp: os.path.join(tag_dir, model_states_file(tp, layout.zero_stage)) for tp in part.sources(layout.tensor)}
    mappable = all_mappable(paths.values())
    module = _module_names(load_file(paths[min(paths)])["module"])
    of = {name: piece_unit(mappable, 0, name, num_layers) for name in module}

    def read(unit: Hashable) -> dict:
        names = names_in(of, unit)
        shards = {}
        for tp, path in paths.items():
            module = _module_names(load_file(path)["module"])
            shards[tp] = {name: module[name] for name in names}
        return {name: _assembled(part, shards, layout.tensor, name, name) for name in names}
    return Units(of, read)


def _expert_units(tag_dir: str, split: bool) -> Units:
    """Every expert of an MoE checkpoint, under the single-process model's names, from the expert files of all
    model-parallel ranks, one expert at a time. Whole experts: one file each (a tensor-parallel rank holds the same
    experts as another, then with the same values, or other experts; the lowest rank's file is read). `split`
    (--enable-expert-tensor-parallelism at TP > 1): each rank's file holds its shards of the expert, joined by the
    tensor-parallel plan's rule; the unit is then that expert's files of every rank."""
    files: Dict[str, Dict[int, str]] = {}  # name -> model-parallel rank -> its file
    for file_name in sorted(os.listdir(tag_dir)):
        match = EXPERT_FILE_PATTERN.fullmatch(file_name)
        if match:
            path = os.path.join(tag_dir, file_name)
            for key in load_file(path):
                files.setdefault(key, {})[int(match.group(3))] = path
    of = {key: tuple(by_rank[rank] for rank in sorted(by_rank)) if split else by_rank[min(by_rank)]
          for key, by_rank in files.items()}

    def read(unit: Hashable) -> dict:
        paths = unit if split else (unit,)
        states = [load_file(path) for path in paths]
        return {key: join_shards(key, [state[key] for state in states], experts=True) if split else states[0][key]
                for key in names_in(of, unit)}
    return Units(of, read)


# --- Megatron's layout: one file per tensor- and pipeline-parallel rank

def _megatron_units(tag_dir: str, layout: Layout, num_layers: int, part: TensorShard) -> Units:
    """Each stage's layers numbered from 0 in its file; the stages' layers follow one another."""
    sources = part.sources(layout.tensor)
    paths = {(tp, pp): _megatron_rank_file(tag_dir, tp, pp, layout.pipeline)
             for pp in range(layout.pipeline) for tp in sources}
    mappable = all_mappable(paths.values())
    keys, of, first_layer = {}, {}, 0  # GPTModel name -> its key in its stage's files, its unit
    for pp in range(layout.pipeline):
        stage_layers = set()
        for key in flatten(load_file(paths[sources[0], pp])[MEGATRON_MODEL]):
            name = key
            if key.startswith(LAYERS_PREFIX):
                _, number, rest = key.split(".", 2)
                stage_layers.add(int(number))
                name = f"{LAYERS_PREFIX}{first_layer + int(number)}.{rest}"
            keys[name], of[name] = key, piece_unit(mappable, pp, name, num_layers)
        first_layer += len(stage_layers)

    def read(unit: Hashable) -> dict:
        names, pp = names_in(of, unit), unit[0]
        shards = {}
        for tp in sources:
            stage = flatten(load_file(paths[tp, pp])[MEGATRON_MODEL])
            shards[tp] = {keys[name]: stage[keys[name]] for name in names}
        return {name: _assembled(part, shards, layout.tensor, keys[name], name) for name in names}
    return Units(of, read)


# --- DeepSpeed universal (ds_to_universal's output): one file per full parameter

def _universal_units(tag_dir: str, num_layers: int, padded_vocab_size: int, part: TensorShard) -> Units:
    """zero/<engine name>/fp32.pt of a universal checkpoint, the vocabulary padding ds_to_universal strips put
    back (as zeros, as DeepSpeed's loader pads it)."""
    universal = os.path.join(tag_dir, UNIVERSAL_DIR)
    entries = sorted(entry for entry in os.listdir(universal) if os.path.isdir(os.path.join(universal, entry)))
    of = {model_name(entry, num_layers): entry for entry in entries}

    def read(entry: str) -> dict:
        name, tensor = model_name(entry, num_layers), load_file(os.path.join(universal, entry, "fp32.pt"))["param"]
        whole = padded_rows(tensor, padded_vocab_size) if name == WORD_EMBEDDINGS else tensor
        return {name: part.assemble(name, {0: whole}, 1)}
    return Units(of, read)


def padded_rows(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    """`tensor` with zero rows appended up to `rows` (a vocabulary whose padding ds_to_universal stripped)."""
    if tensor.dim() == 0 or tensor.shape[0] >= rows:
        return tensor
    return torch.cat([tensor, tensor.new_zeros(rows - tensor.shape[0], *tensor.shape[1:])])


# --- ZeRO 3: the weights are the fp32 partitions in the optimizer files

Zero3Place = Tuple[int, int, torch.Size]  # offset in a rank's flat partition, elements per rank, shape


def zero3_placement(param_shapes: List[Mapping[str, torch.Size]], world: int) -> Tuple[Dict[str, Zero3Place], int]:
    """Where each parameter lies in ZeRO-3's flat partitions (one flat tensor per data-parallel rank, its groups
    concatenated), and how many values a rank holds: each parameter is split on its own into ceil(numel / DP)
    elements per rank, laid out one after another in the order of param_shapes."""
    placement, offset = {}, 0
    for name, shape in ((name, shape) for group in param_shapes for name, shape in group.items()):
        per_rank = -(-torch.Size(shape).numel() // world)
        placement[name] = (offset, per_rank, torch.Size(shape))
        offset += per_rank
    return placement, offset


def _check_zero3_size(flat_size: int, accounted: int) -> None:
    if accounted != flat_size:
        raise InputError(f"ZeRO-3 partitions hold {flat_size} values per rank but the parameter shapes account for "
                         f"{accounted}: the checkpoint's files do not belong together")


def flat_range(groups: Sequence[torch.Tensor], offset: int, length: int) -> torch.Tensor:
    """Values offset..offset+length of the concatenation of `groups` (flattened), reading only those."""
    parts, start = [], 0
    for group in groups:
        flat = group.flatten()
        low, high = max(offset, start), min(offset + length, start + flat.numel())
        if low < high:
            parts.append(flat.narrow(0, low - start, high - low))
        start += flat.numel()
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def zero3_parameter(place: Zero3Place, groups_per_rank: Sequence[Sequence[torch.Tensor]]) -> torch.Tensor:
    """One full parameter from every data-parallel rank's flat groups."""
    offset, per_rank, shape = place
    pieces = [flat_range(groups, offset, per_rank) for groups in groups_per_rank]
    return torch.cat(pieces)[:shape.numel()].view(shape).clone()


def zero3_units(tag_dir: str, layout: Layout, args: Mapping[str, object], num_layers: int, part: TensorShard,
                kind: str = "fp32", dtype: Optional[torch.dtype] = None) -> Units:
    """ZeRO 3's fp32 weights (`kind` fp32, cast to `dtype` unless None) or an Adam moment (exp_avg, exp_avg_sq),
    kept in the same flat layout: a parameter is read from each data-parallel rank's optimizer file, its range of
    the memory-mapped partitions only."""
    sources = part.sources(layout.tensor)
    placements = {}  # per source rank: engine name -> place
    for tp in sources:
        shapes = load_file(os.path.join(tag_dir, model_states_file(tp, 3)))["param_shapes"]
        placements[tp], accounted = zero3_placement(shapes, layout.data)
        _check_zero3_size(sum(group.numel() for group in zero3_groups(tag_dir, args, tp, 0, kind)), accounted)
    engine_names = {current_name(name): name for name in placements[sources[0]]}  # GPTModel name -> engine name
    paths = [os.path.join(tag_dir, optimizer_states_file(tp, dp, bool(args.get("bf16"))))
             for tp in sources for dp in range(layout.data)]
    mappable = all_mappable(paths)
    of = {name: piece_unit(mappable, 0, name, num_layers) for name in engine_names}

    def read(unit: Hashable) -> dict:
        names = names_in(of, unit)
        shards = {}
        for tp in sources:
            groups = [zero3_groups(tag_dir, args, tp, dp, kind) for dp in range(layout.data)]
            shards[tp] = {}
            for name in names:
                tensor = zero3_parameter(placements[tp][engine_names[name]], groups)
                shards[tp][name] = tensor if dtype is None else tensor.to(dtype)
        return {name: _assembled(part, shards, layout.tensor, name, name) for name in names}
    return Units(of, read)


def zero3_groups(tag_dir: str, args: Mapping[str, object], tp: int, dp: int, kind: str) -> List[torch.Tensor]:
    """One rank's flat partitions of `kind` (fp32, exp_avg, exp_avg_sq), one per parameter group."""
    partition = zero_optimizer_state(tag_dir, args, tp, dp)
    if kind == "fp32":
        return partition["fp32_flat_groups"]
    adam = partition["optimizer_state_dict"]["state"]
    return [adam[group][kind] for group in sorted(adam)]


def zero_optimizer_state(tag_dir: str, args: Mapping[str, object], mp_rank: int, dp_rank: int) -> dict:
    """One data-parallel rank's ZeRO optimizer partition (DeepSpeed names the files bf16_... under --bf16)."""
    path = os.path.join(tag_dir, optimizer_states_file(mp_rank, dp_rank, bool(args.get("bf16"))))
    return load_file(path)["optimizer_state_dict"]


def read_checkpoint(load_dir: str, iteration: Optional[int] = None, progress: Progress = _quiet,
                    universal: bool = False, part: TensorShard = WHOLE, streamed: bool = False) -> Checkpoint:
    """The checkpoint in `load_dir` (its newest, or that of `iteration`; with `universal` the one
    `latest_universal` names) with the full model weights, or with `part`'s shard of each (its padded
    vocabulary size is still the whole model's). With `streamed`, the weights are read when asked for
    (StreamedWeights), for a caller that uses one tensor at a time."""
    tag_dir = checkpoint_directory(load_dir, iteration, universal)
    state = read_client_state(tag_dir, whole=part == WHOLE)  # not kept: the weights are read again, unit by unit
    args = state[ARGS]
    layout = layout_of(state, tag_dir)
    num_layers = int(args["num_layers"])
    engine_weights = (any(name.startswith("layer_") for name in os.listdir(tag_dir)) if layout.pipeline_engine
                      else state.get("module") is not None or not layout.universal)
    if layout.megatron:
        units = _megatron_units(tag_dir, layout, num_layers, part)
    elif not engine_weights:  # DeepSpeed's ds_to_universal copies the model-states files only
        units = _universal_units(tag_dir, num_layers, int(args["padded_vocab_size"]), part)
    elif layout.pipeline_engine:
        units = _pipeline_engine_units(tag_dir, layout, num_layers, part)
    elif layout.zero_stage == 3:
        units = zero3_units(tag_dir, layout, args, num_layers, part, dtype=training_dtype(args))
    else:
        split = bool(args.get("enable_expert_tensor_parallelism")) and layout.tensor > 1
        units = _joined(_plain_engine_units(tag_dir, layout, num_layers, part), _expert_units(tag_dir, split))
    model = StreamedWeights(units) if streamed else _read_whole(units, progress)
    padded_vocab_size = model["embedding.word_embeddings.weight"].shape[0] * part.size  # rows are split
    return Checkpoint(directory=tag_dir, iteration=int(state[ITERATION]),
                      consumed_train_samples=recorded_consumed_samples(state), args=MappingProxyType(dict(args)),
                      layout=layout, padded_vocab_size=padded_vocab_size, model=MappingProxyType(model),
                      has_optimizer_state=holds_optimizer_state(tag_dir, state), old=not is_current(state))
