"""What tools/inspect_checkpoint.py shows: a checkpoint (ours at any layout, or a Hugging Face GPT-2 directory)
as its iteration, layout, key flags and every full parameter; and the per-tensor difference of two."""
import os
from dataclasses import dataclass
from typing import Dict, List, Mapping

import torch

from megatron.checkpoint import hf
from megatron.checkpoint.directory import experts_split
from megatron.checkpoint.reader import read_checkpoint
from megatron.checkpoint.weight_units import Progress, quiet
from megatron.config.model_config import ARCHITECTURE_FLAGS
from megatron.model.gpt_config import gpt_config

KEY_FLAGS = (*ARCHITECTURE_FLAGS, "seq_length", "padded_vocab_size", "tokenizer_type", "fp16", "bf16",
             "micro_batch_size", "global_batch_size", "lr", "seed")
WORD_EMBEDDING = "embedding.word_embeddings.weight"


@dataclass(frozen=True)
class Examined:
    header: List[str]  # what the checkpoint is, one fact per line
    model: Mapping[str, torch.Tensor]  # full tensors under GPTModel's names
    from_hf: bool


def examine(path: str, progress: Progress = quiet) -> Examined:
    """Read `path`: a Hugging Face directory when it holds config.json, else one of our checkpoints."""
    if os.path.isfile(os.path.join(path, hf.CONFIG_FILE)):
        config_json = hf.read_hf_config(path)
        config = gpt_config(hf.model_config_from_hf(config_json, os.path.join(path, hf.CONFIG_FILE)),
                            int(config_json["vocab_size"]))
        model = hf.from_hf_state_dict(hf.read_hf_weights(path), config, config_json["vocab_size"])
        header = [f"Hugging Face GPT-2 model {path}", f"vocabulary: {config_json['vocab_size']}",
                  f"activation: {config_json.get('activation_function')}"]
        return Examined(header, model, from_hf=True)
    checkpoint = read_checkpoint(path, progress=progress)
    header = [f"checkpoint {checkpoint.directory}", f"iteration: {checkpoint.iteration}",
              f"consumed train samples: {checkpoint.consumed_train_samples}",
              f"layout: {checkpoint.layout.describe()}",
              "flags: " + " ".join(f"--{flag.replace('_', '-')}={checkpoint.args[flag]}" for flag in KEY_FLAGS
                                   if flag in checkpoint.args)]
    moe = checkpoint.moe
    if moe is not None:
        experts = " ".join(map(str, moe.num_experts))
        split = " --enable-expert-tensor-parallelism" if experts_split(checkpoint.args) else ""
        header.append(f"mixture of experts: --num-experts {experts} --expert-interval {moe.expert_interval} "
                      f"--mlp-type {moe.mlp_type} --topk {moe.topk} --moe-expert-parallel-size "
                      f"{checkpoint.args['moe_expert_parallel_size']}{split}")
    return Examined(header, checkpoint.model, from_hf=False)


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
    differs). Against a Hugging Face model, only the real vocabulary rows of the word embedding count."""
    result = {}
    for name in list(a.model) + [name for name in b.model if name not in a.model]:
        first, second = a.model.get(name), b.model.get(name)
        if first is None or second is None:
            result[name] = float("inf")
            continue
        if name == WORD_EMBEDDING and (a.from_hf or b.from_hf):
            rows = min(first.shape[0], second.shape[0])
            first, second = first[:rows], second[:rows]
        if first.shape != second.shape:
            result[name] = float("inf")
            continue
        result[name] = (first.double() - second.double()).abs().max().item() if first.numel() else 0.0
    return result
