"""--torch-compile: the plain model compiles whole (embedding to loss, one graph), a pipeline stage piece by piece,
and either computes what the eager model does."""
import copy
import dataclasses

import pytest
import torch
from tests.helpers.distributed import run_on_ranks

from megatron.config.arguments import job_config, parse_args, validate_args
from megatron.model.gpt import GPTConfig, GPTModel
from megatron.model.provider import apply_torch_compile

FLAGS = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
         "--micro-batch-size", "2", "--lr", "1e-3", "--train-iters", "2", "--mock-data", "--tokenizer-type",
         "NullTokenizer", "--vocab-size", "128"]
GPT2 = GPTConfig(vocab_size=128, max_position_embeddings=16, num_layers=2, hidden_size=32, num_attention_heads=4,
                 hidden_dropout=0.0, attention_dropout=0.0)
# Every architecture field off GPT-2's: RMSNorm, rotary, SwiGLU, grouped-query attention, no biases, untied head.
LLAMA = GPTConfig(vocab_size=128, max_position_embeddings=16, num_layers=2, hidden_size=32, num_attention_heads=4,
                  hidden_dropout=0.0, attention_dropout=0.0, normalization="rmsnorm", add_position_embedding=False,
                  use_rotary_position_embeddings=True, swiglu=True, num_key_value_heads=2, add_bias_linear=False,
                  untie_embeddings_and_output_weights=True)
TOKENS = torch.randint(0, 128, (2, 17), generator=torch.Generator().manual_seed(1))


def test_the_flag_reaches_the_model_config():
    assert job_config(validate_args(parse_args(FLAGS + ["--torch-compile"]), 1, "cpu")).model.torch_compile
    assert not job_config(validate_args(parse_args(FLAGS), 1, "cpu")).model.torch_compile


def loss_and_gradients(model):
    loss = model(TOKENS[:, :-1], labels=TOKENS[:, 1:])
    loss.backward()
    return loss.item(), {name: parameter.grad for name, parameter in model.named_parameters()}


def assert_same_step(eager, compiled):
    """fp32: the compiled loss and every gradient equal the eager ones to rounding."""
    loss, gradients = loss_and_gradients(eager)
    compiled_loss, compiled_gradients = loss_and_gradients(compiled)
    assert compiled_loss == pytest.approx(loss, rel=1e-6)
    assert compiled_gradients.keys() == gradients.keys()
    for name, gradient in gradients.items():
        torch.testing.assert_close(compiled_gradients[name], gradient, rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.full  # inductor compiles C++ for the CPU: about a minute
def test_the_whole_model_compiles_to_one_graph_that_gives_the_eager_loss_and_gradients():
    from torch._dynamo.testing import CompileCounterWithBackend

    torch.manual_seed(0)
    eager = GPTModel(GPT2)
    compiled = copy.deepcopy(eager)
    graphs = CompileCounterWithBackend("inductor")
    apply_torch_compile(compiled, backend=graphs)
    assert_same_step(eager, compiled)
    # Embedding, layers, final norm, head and the chunked loss (forward and backward) in one graph: nothing
    # between them runs eagerly, so inductor may fuse across the pieces.
    assert (graphs.frame_count, graphs.op_count > 0) == (1, True)


@pytest.mark.parametrize("recompute", ["full", "selective"])  # none: the tensor-parallel test below
def test_llama_compiles_whole_with_recomputation(recompute):
    """Dynamo's capture and AOT autograd (inductor's input) on the Llama architecture, with every recompute mode;
    the aot_eager backend runs the captured graphs without generating code, so this stays quick."""
    config = dataclasses.replace(LLAMA, recompute_granularity=recompute, recompute_method=recompute and "uniform")
    eager = GPTModel(config)
    compiled = copy.deepcopy(eager)
    apply_torch_compile(compiled, backend="aot_eager")
    assert_same_step(eager, compiled)


def pipeline_and_plain_steps():
    """On each rank of TP 2: the pipeline stage (PP 1) of GPT-2 (tied head) and of Llama (untied), and GPT-2's
    plain model, each eager and compiled (aot_eager), one forward and backward of the same batch; per model (eager
    loss, compiled loss, gradients equal)."""
    import deepspeed

    from megatron.model.gpt import GPTModel
    from megatron.model.parallelize import piece_sharder
    from megatron.model.pipe import GPTPipe, compiled_pieces, pipeline_micro_batch
    from megatron.data.gpt_batch import make_batch
    from megatron.parallel_state import ParallelState
    from megatron.tensor_parallel import tensor_parallel_rng_tracker

    deepspeed.init_distributed("gloo", verbose=False)
    parallel = ParallelState(tensor_parallel_size=2)
    tracker = tensor_parallel_rng_tracker(5, parallel.tp_rank)
    inputs, (labels, loss_mask) = pipeline_micro_batch(make_batch(TOKENS, eod=127))

    def pipeline_step(stage):
        loss = stage.loss_fn(stage(inputs), (labels, loss_mask))
        loss.backward()
        return loss.item(), [parameter.grad for parameter in stage.parameters()]

    def plain_step(model):
        loss = model(inputs[0], position_ids=inputs[1], labels=labels, loss_mask=loss_mask)
        loss.backward()
        return loss.item(), [parameter.grad for parameter in model.parameters()]

    results = []
    def pipeline(config):
        return GPTPipe(config, parallel, tracker)

    def plain(config):
        return GPTModel(config, piece_sharder(parallel, False, tracker))

    for config, build, step in ((GPT2, pipeline, pipeline_step), (LLAMA, pipeline, pipeline_step),
                                (GPT2, plain, plain_step)):
        eager, compiled = build(config), build(config)  # the same weights: each piece draws them from its own seed
        apply_torch_compile(compiled, backend="aot_eager")
        if step is pipeline_step:  # every piece, the tied or untied head included
            assert all(piece._compiled_call_impl is not None for piece in compiled_pieces(compiled))
            assert len(compiled_pieces(compiled)) == config.num_layers + 4
        (loss, gradients), (compiled_loss, compiled_gradients) = step(eager), step(compiled)
        results.append((loss, compiled_loss, all(torch.allclose(a, b, rtol=1e-5, atol=1e-7)
                                                 for a, b in zip(compiled_gradients, gradients))))
    return results


@pytest.mark.full  # two processes
def test_pipeline_stages_and_tensor_parallel_models_compile_to_the_eager_results():
    for rank_results in run_on_ranks(pipeline_and_plain_steps, 2):
        for loss, compiled_loss, same_gradients in rank_results:
            assert compiled_loss == pytest.approx(loss, rel=1e-6) and same_gradients
        gpt2_pipeline, _, gpt2_plain = rank_results
        assert gpt2_plain[0] == pytest.approx(gpt2_pipeline[0], rel=1e-5)  # the engines' models: one network


def losses_of_training(argv):
    """pretrain() with the trainer's RNG tracker in the model; with --torch-compile the model is compiled with
    aot_eager (dynamo's capture and AOT autograd as inductor gets them, without generating code)."""
    from megatron.model.provider import model_provider
    from megatron.training.loop import pretrain

    def cheaply_compiled(model_config, *rest):
        model = model_provider(model_config, *rest)
        if model_config.torch_compile:
            model.compile(backend="aot_eager")
        return model

    return pretrain(cheaply_compiled, argv).losses


TRAINER_FLAGS = [*FLAGS, "--no-pipeline-parallel", "--hidden-dropout", "0", "--attention-dropout", "0",
                 "--log-interval", "1", "--eval-iters", "0"]


@pytest.mark.full  # whole runs
def test_the_trainer_compiles_the_plain_model_with_every_recompute_mode():
    """The trainer's checkpoint rewinds its tracker's streams (a context_fn dynamo refuses); compiled, torch's own
    recomputation does that, and each mode trains as the eager model does."""
    eager = run_on_ranks(losses_of_training, 1, TRAINER_FLAGS)[0]
    for recompute in (["--checkpoint-activations"], ["--recompute-granularity", "selective"],
                      ["--recompute-granularity", "full", "--recompute-method", "uniform"]):
        compiled = run_on_ranks(losses_of_training, 1, [*TRAINER_FLAGS, "--torch-compile", *recompute])[0]
        assert compiled == pytest.approx(eager, rel=1e-5), recompute
