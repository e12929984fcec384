"""A trained model ready for generation or evaluation, from a checkpoint of any layout.

Every rank reads only its tensor-parallel shard of each weight with checkpoint/formats/reader.py (whatever
TP x PP x DP and ZeRO stage wrote it; the files and ranges it does not need stay unread), builds its part of the
model without initialising it (sharded as training shards a freshly built model), and loads its shards: a rank
holds its shard, never the whole model. The tokenizer comes from the flags given, each one defaulting to what the training run
recorded, and must be the one the model was trained with.
"""
import dataclasses
import logging
from typing import Mapping, Optional

import torch

from megatron.checkpoint.formats.detect import read_client_state
from megatron.checkpoint.formats.locate import checkpoint_directory
from megatron.config.recorded_flags import RecordedFlags
from megatron.checkpoint.parameter_names import VOCABULARY_ROWS, WORD_EMBEDDINGS
from megatron.checkpoint.formats.checkpoint import Checkpoint
from megatron.checkpoint.formats.reader import read_checkpoint
from megatron.checkpoint.shards import shard_state_dict
from megatron.checkpoint.formats.weight_units import WHOLE, TensorShard
from megatron.errors import InputError
from megatron.inference.distributed import is_first_rank
from megatron.model.gpt import GPTModel
from megatron.model.gpt_config import gpt_config
from megatron.model.moe import build_model
from megatron.model.kernels import Kernels
from megatron.model.parallelize import apply_tensor_parallel, piece_sharder
from megatron.tensor_parallel import tensor_parallel_rng_tracker
from megatron.tokenizer import build_tokenizer, vocab_size_with_padding

_log = logging.getLogger(__name__)

TOKENIZER_FLAGS = ("tokenizer_type", "vocab_file", "merge_file", "tokenizer_model", "vocab_size")
# Padding never adds this many rows (make-vocab-size-divisible-by x a tensor-parallel size of 64): more padding
# rows than that mean a tokenizer much smaller than the model's vocabulary.
LARGEST_PADDING_UNITS = 64


def recorded_flags(load_dir: str, iteration: Optional[int] = None) -> Mapping[str, object]:
    """The flags of the training run that wrote the checkpoint (cheap: its first model-states file only)."""
    return read_client_state(checkpoint_directory(load_dir, iteration), whole=False)["args"]  # ranks read shards


def build_checkpoint_tokenizer(given: Mapping[str, object], recorded: Mapping[str, object]):
    """The tokenizer of the flags in `given` (TOKENIZER_FLAGS; None = not given), each missing one taken from
    the checkpoint's recorded flags."""
    chosen = {name: given.get(name) if given.get(name) is not None else recorded.get(name) for name in TOKENIZER_FLAGS}
    if given.get("tokenizer_type") not in (None, recorded.get("tokenizer_type")):
        _log.warning("--tokenizer-type %s differs from the %s the model was trained with", given["tokenizer_type"],
                     recorded.get("tokenizer_type"))
    return build_tokenizer(chosen["tokenizer_type"], vocab_file=chosen["vocab_file"], merge_file=chosen["merge_file"],
                           tokenizer_model=chosen["tokenizer_model"], vocab_size=chosen["vocab_size"])


def check_vocabulary(rows: int, tokenizer_vocab_size: int, args: Mapping[str, object], where: str) -> None:
    """InputError unless the tokenizer is the one the checkpoint in `where` (flags `args`, `rows` embedding rows)
    was trained with: of the vocabulary size it records (or, imported from Hugging Face, at most that), or, where
    it records none, one that `rows` can pad."""
    flags = RecordedFlags.of(args)
    recorded = flags.tokenizer_vocab_size
    if recorded is None:
        padding_unit = flags.make_vocab_size_divisible_by
        if tokenizer_vocab_size <= rows < tokenizer_vocab_size + padding_unit * LARGEST_PADDING_UNITS:
            return
        trained = f"{rows} embedding rows (a padded vocabulary)"
    elif tokenizer_vocab_size == recorded or (args.get("imported_from") and tokenizer_vocab_size < recorded):
        return  # an imported model's vocabulary may hold rows past its tokenizer's ids (a padded vocabulary)
    else:
        trained = f"a tokenizer of {recorded} tokens"
    trained_with = " ".join(f"--{name.replace('_', '-')} {args[name]}" for name in TOKENIZER_FLAGS
                            if args.get(name) is not None)
    raise InputError(f"vocabulary mismatch: the model in {where} was trained with {trained}, but this tokenizer has "
                     f"{tokenizer_vocab_size} tokens; use the tokenizer it was trained with "
                     f"({trained_with or 'see its training command'})")


def fit_vocabulary_rows(weight: torch.Tensor, tensor_parallel_size: int, tokenizer_vocab_size: int,
                        padding_unit: int) -> torch.Tensor:
    """The word embedding with as many rows as `tensor_parallel_size` can split: unchanged when it divides them,
    else re-padded by Megatron's rule (padding rows hold no token, so dropping or adding zero rows changes no
    token's embedding; the added zero rows do take part in the softmax of a loss)."""
    if weight.shape[0] % tensor_parallel_size == 0:
        return weight
    rows = vocab_size_with_padding(tokenizer_vocab_size, padding_unit, tensor_parallel_size)
    fitted = weight.new_zeros((rows, weight.shape[1]))
    kept = min(rows, weight.shape[0])
    fitted[:kept] = weight[:kept]
    return fitted


def load_model(load_dir: str, *, tokenizer_vocab_size: int, parallel_state, kernels: Kernels, dtype: torch.dtype,
               device: torch.device, iteration: Optional[int] = None) -> tuple[GPTModel, Checkpoint]:
    """This rank's part of the model in `load_dir` (eval mode, dropout off), sharded over the tensor-parallel
    group of `parallel_state` (a ParallelState, or None in a single process), and the checkpoint read (for a
    dense model whose vocabulary splits over this TP size, its weights are this rank's shards)."""
    tensor_parallel_size = 1 if parallel_state is None else parallel_state.get_tensor_model_parallel_world_size()
    tp_rank = 0 if parallel_state is None else parallel_state.get_tensor_model_parallel_rank()
    flags = RecordedFlags.of(recorded_flags(load_dir, iteration))
    rows = flags.padded_vocab_size
    # A dense model reads only this rank's shards when its recorded rows split over this TP size; otherwise (and
    # an MoE model, built whole and then sharded) the whole checkpoint is read and the vocabulary re-padded.
    shard_local = flags.whole_model_moe is None and rows is not None and rows % tensor_parallel_size == 0
    part = TensorShard(tp_rank, tensor_parallel_size) if shard_local else WHOLE
    checkpoint = read_checkpoint(load_dir, iteration, progress=_log.info if is_first_rank() else lambda _: None,
                                 part=part)
    check_vocabulary(checkpoint.padded_vocab_size, tokenizer_vocab_size, checkpoint.args, checkpoint.directory)
    weights, rows = dict(checkpoint.model), checkpoint.padded_vocab_size
    if not shard_local:
        padding_unit = checkpoint.flags.make_vocab_size_divisible_by
        for name in VOCABULARY_ROWS:
            if name in weights:
                weights[name] = fit_vocabulary_rows(weights[name], tensor_parallel_size, tokenizer_vocab_size,
                                                    padding_unit)
        rows = weights[WORD_EMBEDDINGS].shape[0]
    inference = dataclasses.replace(checkpoint.model_config, hidden_dropout=0.0, attention_dropout=0.0,
                                    checkpoint_activations=False)
    config = gpt_config(inference, rows, kernels, moe=checkpoint.moe)
    tracker = None if parallel_state is None else tensor_parallel_rng_tracker(config.init_seed, tp_rank)
    if checkpoint.moe is not None:
        model = _loaded(lambda: build_model(config), weights, dtype)
        if tensor_parallel_size > 1:
            model = apply_tensor_parallel(model, parallel_state, rng_tracker=tracker)
        return model.to(device).eval(), checkpoint
    if not shard_local:
        weights = {name: shard.clone() for name, shard in shard_state_dict(weights, tp_rank, tensor_parallel_size,
                                                                            config.swiglu).items()}
    prepare = piece_sharder(parallel_state, False, tracker)
    return _loaded(lambda: GPTModel(config, prepare), weights, dtype).to(device).eval(), checkpoint


def _loaded(build, weights: Mapping[str, torch.Tensor], dtype: torch.dtype) -> GPTModel:
    """build() on the meta device (the weights come from the checkpoint: no random initialisation), then given
    `weights` in `dtype`."""
    with torch.device("meta"):
        model = build()
    model.load_state_dict({name: tensor.to(dtype) for name, tensor in weights.items()}, strict=True, assign=True)
    return model
