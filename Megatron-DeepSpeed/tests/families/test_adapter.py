"""Every family's Hugging Face adapter implements the one HFAdapter protocol: its constants and functions, with
the protocol's parameters in the protocol's order."""
import inspect

import pytest

from megatron.families.adapter import HFAdapter
from megatron.families.registry import FAMILIES

METHODS = [name for name, value in vars(HFAdapter).items() if inspect.isfunction(value) and not name.startswith("_")]


def test_the_protocol_names_what_the_hf_code_calls():
    assert sorted(METHODS) == ["describe", "from_hf_state_dict", "hf_config", "holds", "model_flags_from_hf",
                               "to_hf_tensors"]


@pytest.mark.parametrize("family", FAMILIES, ids=[family.name for family in FAMILIES])
def test_each_adapter_implements_the_protocol(family):
    adapter = family.adapter
    assert isinstance(adapter, HFAdapter)
    assert isinstance(adapter.MODEL_TYPE, str) and isinstance(adapter.ARCHITECTURE, str)
    for name in METHODS:
        expected = list(inspect.signature(getattr(HFAdapter, name)).parameters)[1:]  # without self
        assert list(inspect.signature(getattr(adapter, name)).parameters) == expected, f"{family.name}.{name}"
