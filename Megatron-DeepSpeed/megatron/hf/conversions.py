"""Hugging Face export and import, as tools/convert_checkpoint.py offers them, each writing its whole output
directory atomically: a checkpoint as the transformers directory of the family that holds it, or such a directory
as a checkpoint ready for `--load DIR --finetune` at any target layout."""
import json
import os
import shutil
from typing import Mapping, Optional

from megatron.checkpoint.formats.checkpoint import Checkpoint
from megatron.checkpoint.formats.reader import read_checkpoint
from megatron.checkpoint.formats.weight_units import Progress, quiet
from megatron.hf import directory as hf, files as hf_files
from megatron.config.recorded_flags import RecordedFlags
from megatron.checkpoint.reshape.target_writer import TargetLayout, TrainingState, write_checkpoint
from megatron.errors import InputError
from megatron.families.hf_tensors import DTYPE_KEYS, dtype_keys, dtype_name
from megatron.families.registry import family_asked_for, family_of_model
from megatron.files.atomic import check_output_directory, refuse_overlap, write_directory_atomically
from megatron.model.gpt import GPTConfig
from megatron.model.gpt_config import gpt_config
from megatron.tokenizer import HF_TOKENIZER_TYPE, SENTENCEPIECE_TYPES, vocab_size_with_padding
from megatron.tokenizer.hf_tokenizer import TOKENIZER_FILE, HFTokenizer, hf_tokenizer_files

GPT2_TOKENIZER_FILES = (("vocab_file", "vocab.json"), ("merge_file", "merges.txt"))
SENTENCEPIECE_FILE = "tokenizer.model"
SPECIAL_TOKEN_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")


def unpadded_vocab_size(args: Mapping[str, object]) -> int:
    """The tokenizer's vocabulary size the checkpoint was trained with (rows past it are padding)."""
    flags = RecordedFlags.of(args)
    if flags.tokenizer_vocab_size:
        return flags.tokenizer_vocab_size
    from megatron.tokenizer import build_tokenizer
    try:
        return build_tokenizer(flags.tokenizer_type, **flags.tokenizer_files).vocab_size
    except InputError as err:
        raise InputError(f"the checkpoint does not record its vocabulary size and its tokenizer cannot be built "
                         f"to tell it ({err}); restore the tokenizer files it names") from err


def export_hf(load_dir: str, hf_dir: str, iteration: Optional[int] = None, force: bool = False,
              progress: Progress = quiet, max_shard_bytes: int = hf_files.DEFAULT_SHARD_BYTES,
              architecture: Optional[str] = None) -> Checkpoint:
    """Write the checkpoint as a transformers directory of the family that holds it (families/registry.py): the
    class `architecture` names (refused in one line if it cannot hold the model), else the class the checkpoint
    was imported from where that one holds it (a training run's checkpoint records no such class), padded
    vocabulary rows dropped, safetensors shards of at most `max_shard_bytes` written one at a time from the
    checkpoint read one piece at a time; the tokenizer's files go along when the checkpoint's tokenizer flags still
    name existing files."""
    check_output_directory("--to-hf", hf_dir, force, {"--load": load_dir})
    source = read_checkpoint(load_dir, iteration, progress, streamed=True)
    args, model_config = source.args, source.model_config
    if source.moe is not None:
        raise InputError(f"--to-hf: {load_dir} holds a mixture-of-experts model, and no family's transformers class "
                         "here has experts; it cannot be exported")
    kept = args.get(hf_files.HF_CONFIG_KEPT) or {}
    family = family_of_model(model_config, load_dir, kept.get("architecture"))
    if architecture is not None:
        family = family_asked_for(model_config, load_dir, architecture, family)
    adapter = family.adapter
    config = gpt_config(model_config, source.padded_vocab_size)
    vocab_size = unpadded_vocab_size(args)
    dtype = source.model[next(iter(source.model))].dtype
    special_tokens = kept.get("special_tokens") or hf_tokenizer_special_tokens(args)
    config_json = {**adapter.hf_config(model_config, vocab_size, dtype, special_tokens),
                   **dtype_keys(kept.get("dtype") or dtype_name(dtype))}
    tokenizer_files = tokenizer_files_of(args)
    refuse_overlap("--to-hf", hf_dir, {"the tokenizer file": path for path, _ in tokenizer_files})

    def fill(directory: str) -> None:
        hf_files.write_config_json(directory, config_json)
        progress(f"writing the {adapter.ARCHITECTURE} weights")
        hf_files.write_weights(directory, adapter.to_hf_tensors(source.model, config, vocab_size), max_shard_bytes)
        for path, name in tokenizer_files:
            shutil.copyfile(path, os.path.join(directory, name))
        if source.flags.tokenizer_type == "GPT2BPETokenizer" and tokenizer_files:
            with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as handle:
                json.dump({"tokenizer_class": "GPT2Tokenizer", "model_max_length": config.max_position_embeddings,
                           "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
                           "unk_token": "<|endoftext|>"}, handle, indent=2)

    write_directory_atomically(hf_dir, fill, force=force)
    return source


def hf_tokenizer_special_tokens(args: Mapping[str, object]) -> Optional[dict]:
    """The BOS / EOS ids of the checkpoint's HFTokenizer, when it was trained with one whose files still exist (a
    run fine-tuned from an import records its tokenizer, not the imported config.json's ids)."""
    flags = RecordedFlags.of(args)
    path = flags.tokenizer_files["tokenizer_model"]
    if flags.tokenizer_type != HF_TOKENIZER_TYPE or not path or not os.path.exists(str(path)):
        return None
    tokenizer = HFTokenizer(str(path))
    return {"eos_token_id": tokenizer.eod, **({"bos_token_id": tokenizer.bos} if tokenizer.bos is not None else {})}


def tokenizer_files_of(args: Mapping[str, object]) -> list:
    """(path, name in the exported directory) of the checkpoint's tokenizer files, when they all still exist:
    GPT-2's vocab.json and merges.txt, a SentencePiece tokenizer.model, a Hugging Face tokenizer's files."""
    flags = RecordedFlags.of(args)
    kind, named = flags.tokenizer_type, flags.tokenizer_files
    if kind == "GPT2BPETokenizer":
        files = [(named[flag], name) for flag, name in GPT2_TOKENIZER_FILES]
    elif kind in SENTENCEPIECE_TYPES:
        files = [(named["tokenizer_model"], SENTENCEPIECE_FILE)]
    elif kind == HF_TOKENIZER_TYPE and named["tokenizer_model"] and os.path.exists(str(named["tokenizer_model"])):
        files = [(path, os.path.basename(path)) for path in hf_tokenizer_files(str(named["tokenizer_model"]))]
    else:
        return []
    return files if all(path and os.path.isfile(path) for path, _ in files) else []


def imported_args(hf_model: hf.HFModel, padded_vocab_size: int, make_vocab_size_divisible_by: int) -> dict:
    """The flags an imported checkpoint records: the model's, the vocabulary, the directory's tokenizer.json when
    it has one (so generation and export find it), and what an export writes back (dtype, special token ids, the
    transformers class); training flags are the fine-tuning run's own."""
    model, config = hf_model.model_config, hf_model.config
    dtype = next((config[key] for key in DTYPE_KEYS if config.get(key)), None)
    special = {key: config[key] for key in SPECIAL_TOKEN_KEYS if key in config}
    directory = os.path.abspath(hf_model.directory)
    tokenizer = ({"tokenizer_type": HF_TOKENIZER_TYPE, "tokenizer_model": directory}
                 if os.path.isfile(os.path.join(directory, TOKENIZER_FILE)) else {})
    return {**model.to_flags(), "seq_length": model.max_position_embeddings, "fp16": False, "bf16": False,
            "make_vocab_size_divisible_by": make_vocab_size_divisible_by, "tokenizer_vocab_size": hf_model.vocab_size,
            "padded_vocab_size": padded_vocab_size, "zero_stage": 0, "data_parallel_size": 1, **tokenizer,
            hf_files.HF_CONFIG_KEPT: {"dtype": dtype, "special_tokens": special,
                                      "architecture": hf_model.adapter.ARCHITECTURE},
            "imported_from": f"transformers {hf_model.adapter.ARCHITECTURE} ({directory})"}


def import_hf(hf_dir: str, save_dir: str, target: TargetLayout, make_vocab_size_divisible_by: int = 128,
              force: bool = False, progress: Progress = quiet) -> GPTConfig:
    """Write a local transformers directory of a family (families/registry.py) as a checkpoint (iteration 0,
    weights only) at `target`, the vocabulary padded for it, each target file converted from the tensors it needs,
    read one at a time; resume it with `--load save_dir --finetune`."""
    check_output_directory("--save", save_dir, force, {"--from-hf": hf_dir})
    hf_model = hf.read_hf_model(hf_dir)
    padded = vocab_size_with_padding(hf_model.vocab_size, make_vocab_size_divisible_by, target.tensor)
    state = TrainingState(iteration=0, consumed_train_samples=0,
                          args=imported_args(hf_model, padded, make_vocab_size_divisible_by))
    config = gpt_config(hf_model.model_config, padded)
    progress(f"reading {hf_dir}")
    write_directory_atomically(save_dir, lambda directory: write_checkpoint(  # it checks the target first
        directory, hf_model.weights(config), config, state, target, None, progress), force=force)
    return config
