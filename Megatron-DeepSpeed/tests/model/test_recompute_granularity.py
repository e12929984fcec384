"""Upstream main's recompute flags (--recompute-granularity full|selective, --recompute-method uniform|block,
--recompute-num-layers): which layers each recomputes, that recomputation changes no number (dropout on: the
masks repeat), on one process and, in the full tier, under TP2 with sequence parallelism and PP2."""
import pytest
import torch

from megatron import device
from megatron.config.arguments import parse_args, validate_args
from megatron.errors import InputError
from megatron.model.gpt import GPTConfig, GPTModel, recomputed_checkpoints, recomputed_chunks
from tests.helpers.distributed import run_on_ranks
from tests.helpers.training import COMMON

MODES = {  # name: GPTConfig / flag values
    "full uniform 1": dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1),
    "full uniform 2": dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=2),
    "full block 1": dict(recompute_granularity="full", recompute_method="block", recompute_num_layers=1),
    "selective": dict(recompute_granularity="selective"),
    "checkpoint-activations": dict(checkpoint_activations=True, checkpoint_num_layers=2),
    # As upstream: whole chunks of layers recomputed, and inside each layer the attention core once more.
    "checkpoint-activations and selective": dict(checkpoint_activations=True, recompute_granularity="selective"),
}


def config(layers=3, **recompute):
    return GPTConfig(vocab_size=64, max_position_embeddings=16, num_layers=layers, hidden_size=32,
                     num_attention_heads=4, hidden_dropout=0.3, attention_dropout=0.5, **recompute)


@pytest.mark.parametrize("recompute, chunks", [
    (dict(), [(0, 5, False)]),
    (MODES["full uniform 2"], [(0, 2, True), (2, 4, True), (4, 5, True)]),
    (MODES["full block 1"], [(0, 1, True), (1, 5, False)]),
    (dict(MODES["full block 1"], recompute_num_layers=7), [(layer, layer + 1, True) for layer in range(5)]),
    (MODES["selective"], [(0, 5, False)]),
    (MODES["checkpoint-activations"], [(0, 2, True), (2, 4, True), (4, 5, True)]),
])
def test_which_layers_each_mode_recomputes(recompute, chunks):
    assert recomputed_chunks(config(5, **recompute), 5) == chunks


def test_deepspeed_checkpoint_count_of_each_mode():
    assert [recomputed_checkpoints(config(3, **MODES[name])) for name in MODES] == [3, 2, 1, 3, 2, 6]


class CountingAttention:
    """The kernel, counting its calls: a recomputed core runs twice per step."""

    def __init__(self, kernel):
        self.kernel, self.calls = kernel, 0

    def __call__(self, *args):
        self.calls += 1
        return self.kernel(*args)


def one_step(**recompute):
    torch.manual_seed(3)
    model = GPTModel(config(**recompute))
    counters = []
    for layer in model.layers:
        layer.self_attention.attend = CountingAttention(layer.self_attention.attend)
        counters.append(layer.self_attention.attend)
    tokens = torch.randint(0, 64, (2, 13), generator=torch.Generator().manual_seed(5))
    device.manual_seed(11)
    loss = model(tokens[:, :-1], labels=tokens[:, 1:])
    loss.backward()
    return loss, {name: p.grad for name, p in model.named_parameters()}, [c.calls for c in counters]


@pytest.mark.parametrize("mode, calls", [("full uniform 1", [2, 2, 2]), ("full uniform 2", [2, 2, 2]),
                                         ("full block 1", [2, 1, 1]), ("selective", [2, 2, 2]),
                                         ("checkpoint-activations", [2, 2, 2]),
                                         ("checkpoint-activations and selective", [3, 3, 3])])
def test_recomputation_with_dropout_equals_none_exactly(mode, calls):
    loss, grads, plain_calls = one_step()
    recomputed_loss, recomputed_grads, recomputed_calls = one_step(**MODES[mode])
    assert plain_calls == [1, 1, 1] and recomputed_calls == calls
    assert torch.equal(loss, recomputed_loss)
    for name, grad in grads.items():
        assert torch.equal(grad, recomputed_grads[name]), name


BASE = ["--num-layers", "2", "--hidden-size", "8", "--num-attention-heads", "2", "--seq-length", "16",
        "--micro-batch-size", "2", "--lr", "1e-3", "--train-iters", "10", "--mock-data",
        "--tokenizer-type", "NullTokenizer", "--vocab-size", "100"]


@pytest.mark.parametrize("flags, message", [
    ("--recompute-granularity selective --recompute-method uniform", "--recompute-method uniform chooses whole"),
    ("--recompute-activations --recompute-method block", "--recompute-method block chooses whole"),
    ("--recompute-granularity full", "--recompute-granularity full needs --recompute-method"),
    ("--recompute-method uniform", "--recompute-method uniform has no effect without"),
    ("--recompute-granularity full --recompute-method uniform --recompute-num-layers 0", "--recompute-num-layers 0"),
    ("--recompute-granularity full --recompute-method block --checkpoint-activations", "give one of them"),
    ("--recompute-activations --recompute-num-layers 2 --checkpoint-activations --recompute-method uniform",
     "--recompute-method uniform chooses whole"),
    ("--recompute-granularity full --recompute-method uniform --distribute-saved-activations",
     "--distribute-saved-activations splits saved activations over the tensor-parallel group"),
    ("--recompute-activations --distribute-saved-activations", "add --recompute-granularity full"),
])
def test_contradicting_recompute_flags_are_one_line_errors(flags, message):
    with pytest.raises(InputError, match=message.replace("(", r"\(")):
        validate_args(parse_args(BASE + flags.split()), 1, "cpu")


def test_recompute_activations_is_selective_and_the_model_gets_it():
    values = validate_args(parse_args(BASE + ["--recompute-activations"]), 1, "cpu")
    assert values.recompute_granularity == "selective"
    partitioned = validate_args(parse_args(BASE + ["--recompute-granularity", "full", "--recompute-method", "uniform",
                                                   "--distribute-saved-activations",
                                                   "--tensor-model-parallel-size", "2"]), 2, "cpu")
    assert partitioned.partition_activations and partitioned.deepspeed_activation_checkpointing


# --- whole runs: TP2 with sequence parallelism, PP2 ------------------------------------------------------------

DROPOUT = ["--hidden-dropout", "0.1", "--attention-dropout", "0.1"]
RUN_FLAGS = {name: [f"--{key.replace('_', '-')}" if value is True else f"--{key.replace('_', '-')} {value}"
                    for key, value in mode.items()] for name, mode in MODES.items()}


def losses_of_each(argvs):
    """pretrain() once per command line on this rank; the losses of each (on the last rank)."""
    import torch.distributed as dist

    from megatron.model.provider import model_provider
    from megatron.training.loop import pretrain

    losses = [pretrain(model_provider, argv).losses for argv in argvs]
    return losses if dist.get_rank() == dist.get_world_size() - 1 else None


@pytest.mark.full
@pytest.mark.parametrize("layout, modes", [
    (["--tensor-model-parallel-size", "2", "--sequence-parallel", "--no-pipeline-parallel"],
     ["full uniform 1", "full block 1", "selective"]),
    (["--pipeline-model-parallel-size", "2"], ["full uniform 1", "selective"]),
])
def test_recompute_modes_train_as_no_recompute(data_prefix, layout, modes):
    base = [*COMMON, *DROPOUT, *layout, "--data-path", data_prefix]
    argvs = [base] + [base + " ".join(RUN_FLAGS[mode]).split() for mode in modes]
    plain, *recomputed = run_on_ranks(losses_of_each, 2, argvs, timeout=600)[-1]
    assert len(plain) == 5 and plain[-1] < plain[0]
    for mode, losses in zip(modes, recomputed):
        assert losses == pytest.approx(plain, rel=1e-6), mode
