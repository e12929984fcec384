"""--torch-compile: each transformer layer and the loss's chunk math go through torch.compile and compute what
the eager model does."""
import copy

import pytest
import torch

from megatron.config.arguments import job_config, parse_args, validate_args
from megatron.model.gpt import GPTConfig, GPTModel
from megatron.model.provider import apply_torch_compile

FLAGS = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
         "--micro-batch-size", "2", "--lr", "1e-3", "--train-iters", "2", "--mock-data", "--tokenizer-type",
         "NullTokenizer", "--vocab-size", "128"]


def test_the_flag_reaches_the_model_config():
    assert job_config(validate_args(parse_args(FLAGS + ["--torch-compile"]), 1, "cpu")).model.torch_compile
    assert not job_config(validate_args(parse_args(FLAGS), 1, "cpu")).model.torch_compile


@pytest.mark.full  # inductor compiles C++ for the CPU: about half a minute
def test_compiled_layers_give_the_eager_loss_and_gradients():
    config = GPTConfig(vocab_size=128, max_position_embeddings=16, num_layers=2, hidden_size=32,
                       num_attention_heads=4, hidden_dropout=0.0, attention_dropout=0.0)
    torch.manual_seed(0)
    eager = GPTModel(config)
    compiled = copy.deepcopy(eager)
    apply_torch_compile(compiled)
    assert all(layer._compiled_call_impl is not None for layer in compiled.layers)
    assert compiled.embedding._compiled_call_impl is None  # only the transformer layers, and the loss's chunk math
    assert compiled.loss.chunk_kernels.gradient is not eager.loss.chunk_kernels.gradient
    tokens = torch.randint(0, 128, (2, 17), generator=torch.Generator().manual_seed(1))
    losses = []
    for model in (eager, compiled):
        loss = model(tokens[:, :-1], labels=tokens[:, 1:])
        loss.backward()
        losses.append(loss.item())
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)
    for (name, a), (_, b) in zip(eager.named_parameters(), compiled.named_parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-6, msg=name)
