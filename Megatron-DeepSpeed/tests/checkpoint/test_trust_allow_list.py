"""What a checkpoint file may hold, without training: upstream's client state (args as an argparse.Namespace,
a float checkpoint_version, numpy's RNG state) loads as data; a file naming any other callable is refused in one
line naming the file and the type, and loads only when --trust-checkpoint names the type."""
import argparse
import fractions
import random

import numpy as np
import pytest
import torch

from megatron.checkpoint import trust
from megatron.checkpoint.torch_files import load_file
from megatron.errors import InputError


def test_upstreams_client_state_loads_as_data(tmp_path):
    path = str(tmp_path / "mp_rank_00_model_states.pt")
    state = {"args": argparse.Namespace(num_layers=2, lr=1e-3), "checkpoint_version": 3.0, "iteration": 7,
             "tokens": 1024, "rng_state": [{"random_rng_state": random.getstate(),
                                            "np_rng_state": np.random.get_state(),
                                            "torch_rng_state": torch.get_rng_state()}]}
    torch.save(state, path)
    assert trust.unsafe_type(path) is None
    loaded = load_file(path)
    assert loaded["args"] == state["args"] and loaded["checkpoint_version"] == 3.0
    assert np.array_equal(loaded["rng_state"][0]["np_rng_state"][1], state["rng_state"][0]["np_rng_state"][1])


def test_any_other_type_is_refused_unless_trusted(tmp_path):
    path = str(tmp_path / "layer_01-model_00-model_states.pt")
    torch.save({"weight": torch.zeros(2), "ratio": fractions.Fraction(1, 3)}, path)
    assert trust.unsafe_type(path) == "fractions.Fraction"
    with pytest.raises(InputError, match=f"checkpoint file {path} holds fractions.Fraction, which a checkpoint may "
                                         "not hold .* pass --trust-checkpoint") as refused:
        load_file(path)
    assert "\n" not in str(refused.value)
    with trust.trusting(["fractions.Fraction"]):
        assert trust.unsafe_type(path) is None and load_file(path)["ratio"] == fractions.Fraction(1, 3)
