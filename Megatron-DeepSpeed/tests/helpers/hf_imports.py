"""What the families' tests share: a Hugging Face directory imported at several layouts, its tensors, our logits
against transformers', an export read back."""
from typing import Mapping

import torch

from megatron.checkpoint.hf import files as hf_files
from megatron.checkpoint.hf.conversions import export_hf, import_hf
from megatron.checkpoint.reshape.target_writer import TargetLayout


def import_at(hf_dir: str, tmp_path_factory, targets: Mapping[str, TargetLayout]) -> dict:
    """name -> checkpoint directory of `hf_dir` imported at each target (vocabulary padded to 32 x TP)."""
    saved = {}
    for name, target in targets.items():
        saved[name] = str(tmp_path_factory.mktemp(name) / "ckpt")
        import_hf(hf_dir, saved[name], target, make_vocab_size_divisible_by=32)
    return saved


def hf_tensors(directory) -> dict:
    """Every tensor of a Hugging Face directory by name."""
    weights = hf_files.open_weights(directory)
    return {name: weights[name] for name in weights}


def assert_transformers_logits(model, reference, vocab: int, seed: int = 1) -> torch.Tensor:
    """Our `model` (vocabulary padded) gives `reference`'s logits (fp32, 1e-5) on random tokens; returns them."""
    tokens = torch.randint(0, vocab, (2, 12), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens)[..., :vocab], reference(tokens).logits, rtol=1e-5, atol=1e-5)
    return tokens


def exported_and_original(save: str, hf_dir: str, exported: str, **options) -> tuple:
    """Export checkpoint `save` to `exported`; (its tensors, `hf_dir`'s tensors)."""
    export_hf(save, exported, **options)
    return hf_tensors(exported), hf_tensors(hf_dir)
