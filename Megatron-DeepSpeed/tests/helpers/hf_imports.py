"""What the families' tests share: a Hugging Face directory imported at several layouts, its tensors, our logits
against transformers', an export read back and compared, greedy generation against transformers' generate."""
import json
import os
from typing import Mapping

import torch

from megatron.hf import files as hf_files
from megatron.hf.conversions import export_hf, import_hf
from megatron.checkpoint.reshape.target_writer import TargetLayout
from megatron.inference.generation import generate_batch
from megatron.inference.sampling import SamplingParams, prompt_generators


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


# What transformers' config gives that an export need not repeat: its version and where the model was loaded from.
NOT_COMPARED = {"transformers_version", "_name_or_path"}


def config_json(directory) -> dict:
    with open(os.path.join(directory, hf_files.CONFIG_FILE)) as handle:
        return json.load(handle)


def assert_exported_back(save: str, hf_dir: str, exported: str, reference, tokens: torch.Tensor, **options) -> dict:
    """Export checkpoint `save` to `exported`: every tensor and config.json key of `hf_dir` comes back equal, and
    transformers loads it to `reference`'s logits on `tokens` bit for bit. Returns its tensors by name."""
    written, original = exported_and_original(save, hf_dir, exported, **options)
    assert written.keys() == original.keys()
    for name, tensor in original.items():
        assert torch.equal(written[name], tensor), name
    before, after = config_json(hf_dir), config_json(exported)
    assert {key: after.get(key) for key in before if key not in NOT_COMPARED} == \
        {key: value for key, value in before.items() if key not in NOT_COMPARED}
    with torch.no_grad():
        assert torch.equal(type(reference).from_pretrained(exported).eval()(tokens).logits, reference(tokens).logits)
    return written


def assert_greedy_as_generate(model, reference, prompts: list, vocab: int, new_tokens: int = 8) -> None:
    """Our generator (KV cache) continues each prompt greedily with the tokens transformers' generate gives."""
    ours = generate_batch(model, prompts, new_tokens, SamplingParams(), prompt_generators(1, range(len(prompts))),
                          None, vocab, use_kv_cache=True)
    for prompt, generated in zip(prompts, ours):
        expected = reference.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False,
                                      eos_token_id=None, pad_token_id=0)
        assert generated == expected[0, len(prompt):].tolist()


TP2_AND_TP2PP2 = {"tp2": TargetLayout(2, 1), "tp2pp2": TargetLayout(2, 2)}


def seeded_model(model_class, config_class, shape: Mapping, **overrides):
    """A transformers model of `shape` (config keys) and `overrides`, seeded, with random norm weights."""
    from tests.checkpoint.reshape.test_conversions import with_random_vectors

    torch.manual_seed(0)
    return with_random_vectors(model_class(config_class(**{**shape, **overrides})).eval(), "norm")


def saved_sharded(model, tmp_path_factory, name: str) -> str:
    """`model` saved by transformers in several safetensors shards; the directory."""
    directory = str(tmp_path_factory.mktemp("hf") / name)
    model.save_pretrained(directory, max_shard_size="20KB")
    assert os.path.isfile(os.path.join(directory, hf_files.INDEX_FILE))
    return directory
