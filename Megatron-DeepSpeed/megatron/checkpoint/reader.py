"""Read a checkpoint written by pretrain_gpt.py, at any layout, in one CPU process (no torch.distributed).

What DeepSpeed 0.19.8 writes under `--save DIR` (see DESIGN §9), for TP x PP x DP and model-parallel rank
mp = pp_rank * TP + tp_rank:
  DIR/latest                                   the tag of the newest complete checkpoint, e.g. global_step500
  DIR/global_step500/
    pipeline engine:  layer_{piece:02d}-model_{tp:02d}-model_states.pt   one piece's weights (GPT pieces:
                      embedding 0, layers 1..L, final LayerNorm L+1; the tied LM head is not saved again)
                      mp_rank_{mp:02d}_model_states.pt                  client state (module is None)
    plain engine:     mp_rank_{mp:02d}_model_states.pt                  client state + module (GPTModel names)
    ZeRO 1/2:         zero_pp_rank_{dp}_mp_rank_{mp:02d}_optim_states.pt  flat fp32 and Adam partitions
    ZeRO 3:           zero_pp_rank_{dp}_mp_rank_{mp:02d}_model_states.pt  client state, empty module
                      zero_pp_rank_{dp}_mp_rank_{mp:02d}_optim_states.pt  flat fp32 partitions: the weights
The client state (the trainer's checkpoint/save_load.py) holds iteration, consumed samples, the flags and RNG states.
Tensor-parallel shards are joined with shards.join_shards; the result is keyed by the single-process
GPTModel's parameter names, the tied word embedding once.
"""
import os
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Dict, List, Mapping, Optional

import torch

from megatron.checkpoint.layout import LATEST_TAG_FILE, OPTIMIZER_SAVED, TAG_PATTERN, UNIVERSAL_DIR, UNIVERSAL_MARK
from megatron.checkpoint.shards import join_shards
from megatron.errors import InputError
from megatron.config.model_config import ModelConfig
from megatron.model.gpt import EMBEDDING_PIECE, layer_piece

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

    @property
    def universal(self) -> bool:
        return self.data is None

    def describe(self) -> str:
        engine = "pipeline engine" if self.pipeline_engine else "plain engine (--no-pipeline-parallel)"
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
    model: Mapping[str, torch.Tensor]  # full tensors under GPTModel's names, in the training dtype
    has_optimizer_state: bool  # False: saved with --no-save-optim, or converted with --weights-only

    @property
    def model_config(self) -> ModelConfig:
        """The model the recorded flags describe (dropout and activation checkpointing as trained)."""
        return ModelConfig.from_flags(self.args, f"the flags recorded in {self.directory}")


# ----------------------------------------------------------------------------- files

def model_parallel_rank(pp_rank: int, tp_rank: int, tp_size: int) -> int:
    return pp_rank * tp_size + tp_rank


def model_states_file(mp_rank: int, zero_stage: int, dp_rank: int = 0) -> str:
    if zero_stage == 3:
        return f"zero_pp_rank_{dp_rank}_mp_rank_{mp_rank:02d}_model_states.pt"
    return f"mp_rank_{mp_rank:02d}_model_states.pt"


def optimizer_states_file(mp_rank: int, dp_rank: int, bf16: bool = False) -> str:
    return f"{'bf16_' if bf16 else ''}zero_pp_rank_{dp_rank}_mp_rank_{mp_rank:02d}_optim_states.pt"


def layer_file(piece: int, tp_rank: int) -> str:
    return f"layer_{piece:02d}-model_{tp_rank:02d}-model_states.pt"


def load_file(path: str) -> dict:
    """torch.load of one checkpoint file on the CPU, memory-mapped (tensors are read when used, so assembling a
    model holds about one copy of it), with an InputError naming the file when it is missing, truncated or not
    a torch file."""
    if not os.path.isfile(path):
        raise InputError(f"{path} is missing: the checkpoint in {os.path.dirname(path)} is incomplete; point at "
                         "a complete checkpoint (its 'latest' file names the newest complete one)")
    try:
        return torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    except Exception as err:  # torch raises RuntimeError, EOFError, UnpicklingError ... for a damaged file
        raise InputError(f"{path} cannot be read ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); "
                         "the file is truncated or damaged: copy it again or use another checkpoint") from err


def _first_model_states_file(tag_dir: str) -> str:
    for name in (model_states_file(0, 0), model_states_file(0, 3)):
        if os.path.isfile(os.path.join(tag_dir, name)):
            return os.path.join(tag_dir, name)
    raise InputError(f"{tag_dir} holds no {model_states_file(0, 0)} (nor {model_states_file(0, 3)}): it is not a "
                     "checkpoint written by pretrain_gpt.py, or it is incomplete")


def checkpoint_directory(load_dir: str, iteration: Optional[int] = None) -> str:
    """The global_step{N} directory to read: the one `latest` names, or that of `iteration`. `load_dir` may
    also be a global_step{N} directory itself."""
    if not os.path.isdir(load_dir):
        raise InputError(f"checkpoint directory {load_dir} does not exist; give the --save directory of a run")
    if iteration is None and TAG_PATTERN.fullmatch(os.path.basename(os.path.normpath(load_dir))):
        _first_model_states_file(load_dir)
        return load_dir
    if iteration is not None:
        tag_dir = os.path.join(load_dir, f"global_step{iteration}")
        if not os.path.isdir(tag_dir):
            raise InputError(f"{load_dir} has no checkpoint of iteration {iteration} ({tag_dir} does not exist); "
                             f"it has: {', '.join(available_tags(load_dir)) or 'none'}")
        return tag_dir
    tag = read_latest_tag(load_dir)
    if tag is None:
        tags = available_tags(load_dir)
        hint = (f"it has {', '.join(tags)} but no '{LATEST_TAG_FILE}' file: pass --iteration N" if tags else
                "give the --save directory of a training run")
        raise InputError(f"{load_dir} is not a checkpoint directory: {hint}")
    latest, tag_dir = os.path.join(load_dir, LATEST_TAG_FILE), os.path.join(load_dir, tag)
    if not os.path.isdir(tag_dir):
        raise InputError(f"{latest} names checkpoint '{tag}', but {tag_dir} does not exist; pass --iteration N "
                         f"for one that does ({', '.join(available_tags(load_dir)) or 'none found'})")
    return tag_dir


def read_latest_tag(directory: str) -> Optional[str]:
    """The checkpoint name `directory`'s `latest` file holds; None when there is no `latest`. A `latest` that
    cannot be read, or holds no name like 'global_step1000', is an InputError naming the file."""
    path = os.path.join(directory, LATEST_TAG_FILE)
    if not os.path.lexists(path):
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            tag = handle.read().strip()
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"{path} cannot be read ({getattr(err, 'strerror', None) or err}); it names the "
                         f"checkpoint to resume: restore it, or point --load elsewhere") from err
    if not TAG_PATTERN.fullmatch(tag):
        raise InputError(f"{path} holds {tag!r}, not a checkpoint name like 'global_step1000'; write the name "
                         f"of a complete checkpoint directory into it")
    return tag


def available_tags(load_dir: str) -> List[str]:
    tags = [name for name in os.listdir(load_dir) if TAG_PATTERN.fullmatch(name)
            and os.path.isdir(os.path.join(load_dir, name))]
    return sorted(tags, key=lambda tag: int(TAG_PATTERN.fullmatch(tag).group(1)))


# ----------------------------------------------------------------------------- metadata

def read_client_state(tag_dir: str) -> dict:
    """The first model-parallel rank's model-states file: DeepSpeed's bookkeeping plus our client state."""
    state = load_file(_first_model_states_file(tag_dir))
    if not isinstance(state, dict) or "args" not in state or "iteration" not in state:
        raise InputError(f"{_first_model_states_file(tag_dir)} carries no trainer state (iteration, args): it was "
                         "not written by pretrain_gpt.py")
    return state


def holds_optimizer_state(tag_dir: str, state: Mapping[str, object]) -> bool:
    """Whether the checkpoint in tag_dir (client state `state`) carries the optimizer's state."""
    if not state.get(OPTIMIZER_SAVED, True):
        return False
    if not state.get(UNIVERSAL_MARK):
        return True
    universal = os.path.join(tag_dir, UNIVERSAL_DIR)
    return any(os.path.isfile(os.path.join(universal, entry, "exp_avg.pt")) for entry in os.listdir(universal))


def layout_of(state: Mapping[str, object]) -> Layout:
    """The layout a checkpoint's client state (of read_client_state) records."""
    args, universal = state["args"], bool(state.get(UNIVERSAL_MARK))
    return Layout(tensor=int(args["tensor_model_parallel_size"]), pipeline=int(args["pipeline_model_parallel_size"]),
                  data=None if universal else int(args["data_parallel_size"]),
                  zero_stage=None if universal else int(args["zero_stage"]),
                  pipeline_engine=bool(args.get("ds_pipeline_enabled", not args.get("no_pipeline_parallel"))))


def training_dtype(args: Mapping[str, object]) -> torch.dtype:
    return torch.float16 if args.get("fp16") else torch.bfloat16 if args.get("bf16") else torch.float32


# ----------------------------------------------------------------------------- weights

def piece_prefix(piece: int, num_layers: int) -> str:
    """GPTModel's name prefix for the parameters of pipeline piece `piece` (DeepSpeed's layer number)."""
    if piece == EMBEDDING_PIECE:
        return "embedding."
    if piece < layer_piece(num_layers):
        return f"layers.{piece - layer_piece(0)}."
    return ""  # the final LayerNorm piece holds `final_layernorm`, as GPTModel does


def _pipeline_engine_weights(tag_dir: str, layout: Layout, num_layers: int, progress: Progress) -> dict:
    pieces = layer_piece(num_layers) + 1  # embedding, the layers, the final LayerNorm
    model = {}
    for piece in range(pieces):
        progress(f"reading piece {piece + 1}/{pieces} ({layout.tensor} tensor-parallel shard(s))")
        shards = [load_file(os.path.join(tag_dir, layer_file(piece, tp))) for tp in range(layout.tensor)]
        prefix = piece_prefix(piece, num_layers)
        for key in shards[0]:
            model[prefix + key] = join_shards(prefix + key, [shard[key] for shard in shards])
    return model


def _plain_engine_weights(tag_dir: str, layout: Layout, first_state: dict, progress: Progress) -> dict:
    shards = [first_state["module"]]
    for tp in range(1, layout.tensor):
        progress(f"reading tensor-parallel shard {tp + 1}/{layout.tensor}")
        shards.append(load_file(os.path.join(tag_dir, model_states_file(tp, layout.zero_stage)))["module"])
    return {name: join_shards(name, [shard[name] for shard in shards]) for name in shards[0]}


def zero3_flat_params(param_shapes: List[Mapping[str, torch.Size]], flat_per_rank: List[torch.Tensor]
                      ) -> Dict[str, torch.Tensor]:
    """Full tensors from ZeRO-3 flat partitions (one flat tensor per data-parallel rank, its groups
    concatenated): each parameter is split on its own into ceil(numel / DP) elements per rank, laid out
    one after another in the order of param_shapes."""
    world = len(flat_per_rank)
    full, offset = {}, 0
    for name, shape in ((name, shape) for group in param_shapes for name, shape in group.items()):
        numel = torch.Size(shape).numel()
        per_rank = -(-numel // world)
        pieces = [flat.narrow(0, offset, per_rank) for flat in flat_per_rank]
        full[name] = torch.cat(pieces)[:numel].view(shape).clone()
        offset += per_rank
    if offset != flat_per_rank[0].numel():
        raise InputError(f"ZeRO-3 partitions hold {flat_per_rank[0].numel()} values per rank but the parameter "
                         f"shapes account for {offset}: the checkpoint's files do not belong together")
    return full


def _zero3_weights(tag_dir: str, first_state: dict, progress: Progress) -> dict:
    layout, args = layout_of(first_state), first_state["args"]
    shards = []
    for tp in range(layout.tensor):
        param_shapes = (first_state if tp == 0 else
                        load_file(os.path.join(tag_dir, model_states_file(tp, 3))))["param_shapes"]
        flats = []
        for dp in range(layout.data):
            progress(f"reading ZeRO-3 partition {dp + 1}/{layout.data} of tensor-parallel shard {tp + 1}/"
                     f"{layout.tensor}")
            groups = zero_optimizer_state(tag_dir, args, tp, dp)["fp32_flat_groups"]
            flats.append(torch.cat([group.flatten() for group in groups]))
        dtype = training_dtype(args)
        shards.append({name: tensor.to(dtype) for name, tensor in zero3_flat_params(param_shapes, flats).items()})
    return {name: join_shards(name, [shard[name] for shard in shards]) for name in shards[0]}


def zero_optimizer_state(tag_dir: str, args: Mapping[str, object], mp_rank: int, dp_rank: int) -> dict:
    """One data-parallel rank's ZeRO optimizer partition (DeepSpeed names the files bf16_... under --bf16)."""
    path = os.path.join(tag_dir, optimizer_states_file(mp_rank, dp_rank, bool(args.get("bf16"))))
    return load_file(path)["optimizer_state_dict"]


def read_checkpoint(load_dir: str, iteration: Optional[int] = None, progress: Progress = _quiet) -> Checkpoint:
    """The checkpoint in `load_dir` (its newest, or that of `iteration`) with the full model weights."""
    tag_dir = checkpoint_directory(load_dir, iteration)
    state = read_client_state(tag_dir)
    args = state["args"]
    layout = layout_of(state)
    num_layers = int(args["num_layers"])
    if layout.pipeline_engine:
        model = _pipeline_engine_weights(tag_dir, layout, num_layers, progress)
    elif layout.zero_stage == 3:
        model = _zero3_weights(tag_dir, state, progress)
    else:
        model = _plain_engine_weights(tag_dir, layout, state, progress)
    padded_vocab_size = model["embedding.word_embeddings.weight"].shape[0]
    return Checkpoint(directory=tag_dir, iteration=int(state["iteration"]),
                      consumed_train_samples=int(state["consumed_train_samples"]), args=MappingProxyType(dict(args)),
                      layout=layout, padded_vocab_size=padded_vocab_size, model=MappingProxyType(model),
                      has_optimizer_state=holds_optimizer_state(tag_dir, state))
