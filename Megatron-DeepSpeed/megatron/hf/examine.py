"""What tools/inspect_checkpoint.py shows: a checkpoint (ours at any layout, or a Hugging Face directory of a
family) as its iteration, layout, key flags and every full parameter; and the per-tensor difference of two."""
import os
from dataclasses import dataclass
from typing import Dict, List, Mapping

import torch

from megatron.hf.directory import read_hf_model
from megatron.hf.files import CONFIG_FILE, HF_CONFIG_KEPT
from megatron.checkpoint.parameter_names import VOCABULARY_ROWS
from megatron.checkpoint.formats.reader import read_checkpoint
from megatron.checkpoint.formats.weight_units import Progress, quiet
from megatron.config.model_config import ARCHITECTURE_FLAGS
from megatron.model.gpt_config import gpt_config

KEY_FLAGS = (*ARCHITECTURE_FLAGS, "seq_length", "padded_vocab_size", "tokenizer_type", "tokenizer_model", "fp16",
             "bf16", "micro_batch_size", "global_batch_size", "lr", "seed", "imported_from", HF_CONFIG_KEPT)


@dataclass(frozen=True)
class Examined:
    header: List[str]  # what the checkpoint is, one fact per line
    model: Mapping[str, torch.Tensor]  # full tensors under GPTModel's names
    from_hf: bool


def examine(path: str, progress: Progress = quiet) -> Examined:
    """Read `path`: a Hugging Face directory when it holds config.json, else one of our checkpoints."""
    if os.path.isfile(os.path.join(path, CONFIG_FILE)):
        model = read_hf_model(path)
        header = [f"Hugging Face {model.adapter.ARCHITECTURE} model {path}", f"vocabulary: {model.vocab_size}",
                  *model.adapter.describe(model.config), "flags: " + flag_line(model.model_config.to_flags())]
        return Examined(header, model.weights(gpt_config(model.model_config, model.vocab_size)), from_hf=True)
    checkpoint = read_checkpoint(path, progress=progress)
    header = [f"checkpoint {checkpoint.directory}", f"iteration: {checkpoint.iteration}",
              f"consumed train samples: {checkpoint.consumed_train_samples}",
              f"layout: {checkpoint.layout.describe()}",
              "flags: " + flag_line(checkpoint.args)]
    moe = checkpoint.moe
    if moe is not None:
        experts = " ".join(map(str, moe.num_experts))
        split = " --enable-expert-tensor-parallelism" if checkpoint.flags.experts_split else ""
        header.append(f"mixture of experts: --num-experts {experts} --expert-interval {moe.expert_interval} "
                      f"--mlp-type {moe.mlp_type} --topk {moe.topk} --moe-expert-parallel-size "
                      f"{checkpoint.flags.expert_parallel}{split}")
    return Examined(header, checkpoint.model, from_hf=False)


def flag_line(flags: Mapping[str, object]) -> str:
    return " ".join(f"--{flag.replace('_', '-')}={flags[flag]}" for flag in KEY_FLAGS if flag in flags)


def parameter_lines(model: Mapping[str, torch.Tensor]) -> List[str]:
    width = max(len(name) for name in model)
    lines = []
    for name, tensor in model.items():
        norm = tensor.float().norm().item()
        lines.append(f"{name:<{width}}  {str(tuple(tensor.shape)):<16} {str(tensor.dtype).removeprefix('torch.'):<9} "
                     f"norm {norm:.6e}")
    lines.append(f"{len(model)} tensors, {sum(t.numel() for t in model.values()):,} values")
    return lines


def differences(a: Examined, b: Examined) -> Dict[str, float]:
    """Max absolute difference per tensor name of either side (inf where a tensor is missing or its shape
    differs). Against a Hugging Face model, only the real vocabulary rows of the word embedding and output layer
    count."""
    result = {}
    for name in list(a.model) + [name for name in b.model if name not in a.model]:
        first, second = a.model.get(name), b.model.get(name)
        if first is None or second is None:
            result[name] = float("inf")
            continue
        if name in VOCABULARY_ROWS and (a.from_hf or b.from_hf):
            rows = min(first.shape[0], second.shape[0])
            first, second = first[:rows], second[:rows]
        if first.shape != second.shape:
            result[name] = float("inf")
            continue
        result[name] = (first.double() - second.double()).abs().max().item() if first.numel() else 0.0
    return result
