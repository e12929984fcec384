"""The client state a checkpoint carries besides the weights, as upstream Megatron-DeepSpeed b4d4a0e's
save_checkpoint writes it (`args` an argparse.Namespace, checkpoint_version 3.0, iteration, tokens, its RNG keys),
plus DeepSpeed's universal_checkpoint_info; and reading it back from any version, earlier ones of this project
included (args a dict, consumed samples at the top level, RNG states under one key)."""
import argparse
import re
from typing import Any, List, Mapping, Optional

from deepspeed.checkpoint import constants as ds

from megatron.checkpoint.file_names import (ARGS, CHECKPOINT_VERSION, CHECKPOINT_VERSION_VALUE, CONSUMED_TRAIN_SAMPLES,
                                        CUDA_RNG_STATE, GATE_UP_ROWS, ITERATION, NP_RNG_STATE, OLD_RNG_STATE,
                                        OLD_TRACKER_STATES, RANDOM_RNG_STATE, RNG_TRACKER_STATES, TOKENS,
                                        TORCH_RNG_STATE, UNIVERSAL_CHECKPOINT_INFO)
from megatron.checkpoint.parameter_names import LAYERS_PREFIX, TIED_PREFIX, VOCABULARY_ROWS, stage_name
from megatron.checkpoint.shards import HALVES, split_dim


def recorded_args(flags: Mapping[str, Any], consumed_train_samples: int, padded_vocab_size: int,
                  tokenizer_vocab_size: Optional[int]) -> argparse.Namespace:
    """The flags as upstream records them: a Namespace under Megatron's names, with the consumed samples and
    the padded vocabulary size (upstream's tools read both from it)."""
    return argparse.Namespace(**{**flags, CONSUMED_TRAIN_SAMPLES: consumed_train_samples,
                                 "consumed_valid_samples": 0, "padded_vocab_size": padded_vocab_size,
                                 "tokenizer_vocab_size": tokenizer_vocab_size,
                                 **({GATE_UP_ROWS: HALVES} if flags.get("swiglu") else {})})


def build_client_state(args: argparse.Namespace, iteration: int, rng: Optional[Mapping[str, Any]],
                       tracker_states: Optional[Mapping[str, Any]], universal_info: Mapping[str, Any],
                       tokens: Optional[int] = None) -> dict:
    """What DeepSpeed's save_checkpoint is handed as client_state. `rng` holds python / numpy / torch /
    device generator states (None: --no-save-rng). `tokens`, the consumed tokens upstream resumes its count from,
    by default samples x --seq-length (0 for flags that record no sequence length, as an imported model's may
    not); a sequence-length curriculum's run gives its own count."""
    if tokens is None:
        tokens = getattr(args, CONSUMED_TRAIN_SAMPLES) * int(getattr(args, "seq_length", None) or 0)
    state = {ARGS: args, CHECKPOINT_VERSION: CHECKPOINT_VERSION_VALUE, ITERATION: iteration, TOKENS: tokens,
             UNIVERSAL_CHECKPOINT_INFO: dict(universal_info)}
    if rng is not None:
        state.update({RANDOM_RNG_STATE: rng["python"], NP_RNG_STATE: rng["numpy"], TORCH_RNG_STATE: rng["torch"],
                      CUDA_RNG_STATE: rng["device"], RNG_TRACKER_STATES: tracker_states})
    return state


def args_of(state: Mapping[str, Any]) -> dict:
    """The recorded flags as a dict, whether saved as a Namespace (upstream, and this project now) or a dict."""
    args = state[ARGS]
    return dict(vars(args)) if isinstance(args, argparse.Namespace) else dict(args)


def halves_gate_and_up(state: Mapping[str, Any]) -> bool:
    """Whether the checkpoint says its SwiGLU dense_h_to_4h rows are each tensor-parallel rank's [gate; up] halves,
    as upstream Megatron-DeepSpeed main writes them and so this project now: upstream's universal_checkpoint_info
    lists them among DeepSpeed's PARAMETER_WITH_2_SUB_PARAMS_CAT_DIM_0 (main's gpt_model.py; ours too,
    universal_info, except where DeepSpeed writes an MoE model's), and our `args` say so (recorded_args). This
    project's earlier --swiglu checkpoints, [ffn, (gate, up)] interleaved and so a plain dim-0 split, do neither."""
    return (bool((state.get(UNIVERSAL_CHECKPOINT_INFO) or {}).get(ds.PARAMETER_WITH_2_SUB_PARAMS_CAT_DIM_0))
            or args_of(state).get(GATE_UP_ROWS) == HALVES)


def recorded_consumed_samples(state: Mapping[str, Any]) -> int:
    if CONSUMED_TRAIN_SAMPLES in state:  # earlier versions of this project
        return int(state[CONSUMED_TRAIN_SAMPLES])
    return int(args_of(state).get(CONSUMED_TRAIN_SAMPLES, 0))


def rng_states(state: Mapping[str, Any]) -> Optional[dict]:
    """{python, numpy, torch, device} generator states, or None when the checkpoint has none."""
    if OLD_RNG_STATE in state:
        return state[OLD_RNG_STATE]
    if RANDOM_RNG_STATE not in state:
        return None
    return {"python": state[RANDOM_RNG_STATE], "numpy": state[NP_RNG_STATE], "torch": state[TORCH_RNG_STATE],
            "device": state[CUDA_RNG_STATE]}


def tracker_states(state: Mapping[str, Any]) -> Optional[dict]:
    """The tensor-parallel RNG tracker's states, or None."""
    return state.get(RNG_TRACKER_STATES, state.get(OLD_TRACKER_STATES))


def has_rng(state: Mapping[str, Any]) -> bool:
    return rng_states(state) is not None


def is_current(state: Mapping[str, Any]) -> bool:
    """Whether the state was written in upstream's layout (earlier versions of this project wrote none)."""
    return CHECKPOINT_VERSION in state


# ----------------------------------------------------------------------------- universal checkpoint info

def _pattern(name: str, engine_name: str, pipeline_engine: bool) -> str:
    """A regex (matched from the start) for the engine's name of `name`: a transformer layer's parameter in any
    layer, anything else by its exact name."""
    if not name.startswith(LAYERS_PREFIX):
        return re.escape(engine_name) + "$"
    rest = name.split(".", 2)[2]
    return (r"\d+\." if pipeline_engine else r"layers\.\d+\.") + re.escape(rest) + "$"


def universal_info(names: List[str], num_layers: int, pipeline_engine: bool, tokenizer_vocab_size: int,
                   padded_vocab_size: int, experts: bool = False, swiglu: bool = False) -> dict:
    """DeepSpeed's universal_checkpoint_info for GPTModel parameters `names` under the engine's names: how
    ds_to_universal joins each parameter's tensor-parallel slices (the plan's split: dim 0, dim 1 = row
    parallel, none = replicated, and a SwiGLU MLP's [gate_r; up_r] halves as upstream main declares them, two
    sub-parameters), the vocabulary padding it strips (as upstream: the tokenizer's size is kept), and the tied
    embedding's second copy on the last pipeline stage. `experts`: the experts, and PR-MoE's dense MLP beside them,
    are split too (--enable-expert-tensor-parallelism); `swiglu`: the model's MLPs are SwiGLU's."""
    replicated, row_parallel, vocabulary, halves = [], [], [], []
    for name in names:
        engine_name = stage_name(name, num_layers) if pipeline_engine else name
        pattern = _pattern(name, engine_name, pipeline_engine)
        split = split_dim(name, experts, swiglu)
        target = (vocabulary if name in VOCABULARY_ROWS else replicated if split is None
                  else row_parallel if split.dim == 1 else halves if split.blocks == 2 else None)
        if target is not None and pattern not in target:
            target.append(pattern)
    info = {ds.UNIVERSAL_CHECKPOINT_VERSION_KEY: ds.UNIVERSAL_CHECKPOINT_VERSION_VALUE,
            ds.ORIGINAL_VOCAB_SIZE: tokenizer_vocab_size, ds.PADDED_VOCAB_SIZE: padded_vocab_size,
            ds.TP_REPLICATED_PARAMETER_PATTERNS: replicated, ds.PARAMETER_WITH_ROW_PARALLELISM_PATTERNS: row_parallel,
            ds.VOCABULARY_PARAMETER_PATTERNS: vocabulary}
    if halves:
        info[ds.PARAMETER_WITH_2_SUB_PARAMS_CAT_DIM_0] = halves
    if pipeline_engine:
        info[ds.PIPELINE_REPLICATED_PARAMETER_PATTERNS] = [re.escape(TIED_PREFIX)]
    return info
