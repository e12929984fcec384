"""The one table of families: each family's presets are the --model-size table (and nothing else in the library
declares a preset), a config.json finds its family by model_type, and an export its family by the model."""
import ast
import os

import pytest

from megatron.config import presets
from megatron.config.model_config import ModelConfig
from megatron.errors import InputError
from megatron.families.registry import FAMILIES, family_asked_for, family_of_hf_config, family_of_model
from megatron.families.registry import presets as family_presets
from tests.helpers.paths import PACKAGE_ROOT


def test_the_preset_table_is_the_families_presets():
    names = [preset.name for preset in family_presets()]
    assert tuple(names) == presets.preset_names() and len(set(names)) == len(names)
    assert [preset.name for preset in FAMILIES[0].presets][:4] == ["345M", "1.3B", "2.7B", "3.7B"]


def test_presets_are_declared_only_in_the_families_presets_modules():
    """docs/ARCHITECTURE.md: the presets' one source is megatron/families/<name>/presets.py."""
    declaring = set()
    for directory, _, files in os.walk(os.path.join(PACKAGE_ROOT, "megatron")):
        for file in (name for name in files if name.endswith(".py")):
            path = os.path.join(directory, file)
            with open(path, encoding="utf-8") as handle:
                tree = ast.parse(handle.read())
            calls = (node for node in ast.walk(tree) if isinstance(node, ast.Call))
            if any(getattr(call.func, "id", None) == "Preset" for call in calls):
                declaring.add(os.path.relpath(path, PACKAGE_ROOT))
    assert declaring == {f"megatron/families/{family.name}/presets.py" for family in FAMILIES}


@pytest.mark.parametrize("family", FAMILIES, ids=[family.name for family in FAMILIES])
def test_a_config_json_finds_its_family(family):
    config = {"model_type": family.adapter.MODEL_TYPE, "architectures": [family.adapter.ARCHITECTURE]}
    assert family_of_hf_config(config, "config.json") is family
    assert family_of_hf_config({"model_type": family.adapter.MODEL_TYPE}, "config.json") is family


def test_an_unknown_architecture_and_an_unheld_model_are_one_line_naming_every_family():
    with pytest.raises(InputError, match=r"^x/config.json describes a 'phi3' model \(Phi3ForCausalLM\); only "
                                         r"gpt2 \(GPT2LMHeadModel\), llama \(LlamaForCausalLM\), qwen2 "
                                         r"\(Qwen2ForCausalLM\), mistral \(MistralForCausalLM\), qwen3 "
                                         r"\(Qwen3ForCausalLM\) can be imported$"):
        family_of_hf_config({"model_type": "phi3", "architectures": ["Phi3ForCausalLM"]}, "x/config.json")
    swiglu_only = ModelConfig(num_layers=1, hidden_size=8, num_attention_heads=2, max_position_embeddings=4,
                              swiglu=True)
    assert family_of_model(ModelConfig(1, 8, 2, 4), "ckpt").name == "gpt2"
    with pytest.raises(InputError, match=r"^--to-hf: ckpt holds a model with --swiglu True, which none of "
                                         r"transformers' GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM, "
                                         r"MistralForCausalLM, Qwen3ForCausalLM can hold \(GPT-2 needs .*; Llama "
                                         r"needs .*; Qwen2 needs .*; Mistral needs .*; Qwen3 needs .*\)$"):
        family_of_model(swiglu_only, "ckpt")
    with pytest.raises(InputError, match=r"^--hf-architecture 'Phi3ForCausalLM' is not one of GPT2LMHeadModel, "
                                         r"LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM, Qwen3ForCausalLM$"):
        family_asked_for(ModelConfig(1, 8, 2, 4), "ckpt", "Phi3ForCausalLM", FAMILIES[0])
