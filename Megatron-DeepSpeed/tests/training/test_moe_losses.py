"""The figures an MoE model gathers for the log (megatron/training/moe_losses.py), on one rank: the LM loss and the
MoE loss as means over the forward passes since the last call, the dropped expert assignments summed, and nothing
for a dense model. Over several data-parallel ranks: tests/model/test_moe.py's training runs."""
import types

import pytest
import torch

from megatron.model.gpt import GPTConfig, GPTModel
from megatron.training.moe_losses import MoEFigures, take_moe_figures
from tests.helpers.distributed import join_group_of_one
from tests.helpers.moe import skewed_model

ONE_RANK = types.SimpleNamespace(get_data_parallel_group=lambda: None, get_data_parallel_world_size=lambda: 1)


@pytest.fixture(autouse=True)
def group_of_one():
    join_group_of_one()


def test_means_over_the_forwards_and_the_dropped_sum():
    model = skewed_model()  # every token routed to expert 0 of 4: 48 of 64 dropped per forward, MoE loss 0.1
    generator = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(2):
        tokens = torch.randint(0, 200, (2, 32), generator=generator)
        losses.append(model(tokens, labels=tokens).item() - 0.1)
    figures = take_moe_figures(model, ONE_RANK)
    assert figures.dropped_tokens == 96
    assert figures.moe_loss == pytest.approx(0.1)
    assert figures.lm_loss == pytest.approx(sum(losses) / 2, rel=1e-5)
    assert isinstance(figures, MoEFigures)


def test_a_dense_model_has_none():
    dense = GPTModel(GPTConfig(vocab_size=64, max_position_embeddings=8, num_layers=1, hidden_size=8,
                               num_attention_heads=2))
    assert take_moe_figures(dense, ONE_RANK) is None
