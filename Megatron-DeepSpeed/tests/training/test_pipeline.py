"""The GPT model on DeepSpeed's pipeline engine (model/pipe.py, trained by pretrain()) against the single-process
plain model (--no-pipeline-parallel), fp32 and dropout 0: per-iteration losses and gradient norms within 1e-5
relative, the same validation loss and, gathered back under GPTModel's names, the same weights; for PP 1, 2
and 4 and for TP2 x PP2 x DP2 on 8 processes, whose checkpoint then resumes exactly. Sequence lengths that
change between micro-batches train without rebuilding anything, and impossible layouts stop with a message."""
import contextlib
import io
import json
import logging
import os
from dataclasses import dataclass

import pytest
import torch
from tests.helpers.distributed import run_on_ranks
from tests.helpers.training import TINY_FLAGS

from megatron.config.arguments import parse_args, validate_args
from megatron.errors import InputError
from megatron.model.gpt import GPTConfig, GPTModel, TransformerLayer, layer_piece, seeded_init

pytestmark = pytest.mark.full  # multi-process / whole-run tests: the full tier

ITERATIONS = 5
# Global batch 8 = micro batch 2 x DP x micro-batches per step. --clip-grad 0.5 clips every step, so clipping
# under pipeline parallelism is compared too; the attention mask (reset flags) rides along between stages.
COMMON = [*TINY_FLAGS, "--num-layers", "4", "--micro-batch-size", "2", "--global-batch-size", "8",
          "--train-iters", str(ITERATIONS), "--log-interval", "1", "--eval-interval", str(ITERATIONS),
          "--eval-iters", "1", "--adam-eps", "1e-4", "--clip-grad", "0.5", "--reset-attention-mask",
          "--reset-position-ids"]
# --adam-eps: see test_parallel_training.py (the attention key bias has an exactly zero true gradient).


@dataclass
class Run:
    losses: list
    grad_norms: list
    validation_loss: float
    weights: dict
    stdout: str


def train(argv):
    """pretrain() on this rank; rank 0 returns what it saw and the full single-process weights."""
    import torch.distributed as dist

    from tests.helpers.model_state import gather_full_state_dict
    from megatron.model.provider import model_provider
    from megatron.training.loop import pretrain

    stdout = io.StringIO()
    ours = logging.getLogger("megatron")  # our log lines, as run_cli would show them
    ours.setLevel(logging.INFO)
    ours.addHandler(logging.StreamHandler(stdout))
    with contextlib.redirect_stdout(stdout):  # DeepSpeed's
        result = pretrain(model_provider, argv)
    weights = gather_full_state_dict(result.model, result.parallel)
    if dist.get_rank():
        return None
    return Run(result.losses, result.grad_norms, result.validation_loss, weights, stdout.getvalue())


@pytest.fixture(scope="module")
def plain_model(data_prefix):
    return run_on_ranks(train, 1, [*COMMON, "--data-path", data_prefix, "--no-pipeline-parallel"])[0]


def assert_same_training(run: Run, reference: Run):
    assert len(reference.losses) == ITERATIONS and min(reference.grad_norms) > 0.5  # clipped every step
    assert run.losses == pytest.approx(reference.losses, rel=1e-5)
    assert run.grad_norms == pytest.approx(reference.grad_norms, rel=1e-5)
    assert run.validation_loss == pytest.approx(reference.validation_loss, rel=1e-5)
    assert run.weights.keys() == reference.weights.keys() and len(run.weights) == 4 * 12 + 4
    for name, tensor in run.weights.items():
        torch.testing.assert_close(tensor, reference.weights[name], rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("ranks, flags", [
    (1, []),
    (2, ["--pipeline-model-parallel-size", "2", "--zero-stage", "0"]),
    (4, ["--pipeline-model-parallel-size", "4", "--checkpoint-activations"]),
], ids=["pp1", "pp2-zero0", "pp4-recompute"])
def test_pipeline_equals_plain_single_process_model(ranks, flags, data_prefix, plain_model):
    run = run_on_ranks(train, ranks, [*COMMON, "--data-path", data_prefix, *flags])[0]
    assert_same_training(run, plain_model)
    if ranks == 1:  # rank 0 prints DeepSpeed's line, the last rank ours: here they are one process
        assert "samples/sec:" in run.stdout and " iteration        5/       5 |" in run.stdout
        assert "pipeline: transformer layers per stage [4]" in run.stdout


def test_tp2_pp2_dp2_trains_like_single_process_and_resumes_exactly(data_prefix, plain_model, tmp_path):
    layout = ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2", "--sequence-parallel",
              "--checkpoint-activations", "--data-path", data_prefix]
    straight = run_on_ranks(train, 8, [*COMMON, *layout, "--save", str(tmp_path), "--save-interval", "3"])[0]
    assert_same_training(straight, plain_model)
    saved = set(os.listdir(tmp_path / "global_step3"))
    # One file per spec position with parameters and tensor-parallel rank, numbered as upstream's GPTModelPipe
    # (embedding 01, layers 03..06, final LayerNorm 08); the tied LM head is saved with the embedding.
    assert {name for name in saved if name.startswith("layer_")} == {
        f"layer_{spec:02d}-model_{tp:02d}-model_states.pt" for spec in (1, 3, 4, 5, 6, 8) for tp in range(2)}

    (tmp_path / "latest").write_text("global_step3")
    resumed = run_on_ranks(train, 8, [*COMMON, *layout, "--load", str(tmp_path)])[0]
    assert resumed.losses == straight.losses[3:] and resumed.grad_norms == straight.grad_norms[3:]
    for name, tensor in resumed.weights.items():
        torch.testing.assert_close(tensor, straight.weights[name], rtol=0, atol=0, msg=name)


# --- sequence lengths that change from micro-batch to micro-batch -----------------------------------------

VARYING = GPTConfig(vocab_size=64, max_position_embeddings=32, num_layers=3, hidden_size=16, num_attention_heads=2,
                    hidden_dropout=0.0, attention_dropout=0.0, init_seed=5)
LENGTHS = [(8, 16), (4, 12), (10, 6)]  # per optimizer step, one length per micro-batch (even: SP splits them)


def varying_length_batches():
    from megatron.data.gpt_batch import make_batch

    generator = torch.Generator().manual_seed(3)
    return [[make_batch(torch.randint(0, 64, (2, length + 1), generator=generator), eod=63) for length in step]
            for step in LENGTHS]


def pipeline_with_varying_lengths():
    import deepspeed

    from megatron.model.pipe import GPTPipe, pipeline_micro_batch
    from megatron.parallel_state import ParallelState
    from megatron.tensor_parallel import sum_sequence_parallel_gradients_each_step, tensor_parallel_rng_tracker

    deepspeed.init_distributed("gloo", verbose=False)
    parallel = ParallelState(tensor_parallel_size=2, pipeline_parallel_size=2)
    model = GPTPipe(VARYING, parallel, tensor_parallel_rng_tracker(5, parallel.tp_rank), sequence_parallel=True)
    sum_sequence_parallel_gradients_each_step(model, parallel.get_tensor_model_parallel_group(),
                                              micro_batches_per_step=2)
    config = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
              "gradient_clipping": 0.0, "steps_per_print": 10 ** 9,
              "pipeline": {"pipe_partitioned": False, "grad_partitioned": False}}
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
                                           config=config)
    losses = [engine.train_batch(iter(map(pipeline_micro_batch, step))).item() for step in varying_length_batches()]
    return losses, model.layers_per_stage()


def test_sequence_length_may_change_between_micro_batches():
    """TP2 x PP2 with sequence parallelism: each micro-batch has its own length, and the losses are those of the
    plain model trained on the same micro-batches (gradients averaged over each step's two)."""
    def step_losses(model, step):
        return [model(batch["tokens"], position_ids=batch["position_ids"], labels=batch["labels"],
                      loss_mask=batch["loss_mask"]) for batch in step]

    model = GPTModel(VARYING)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    expected = []
    for step in varying_length_batches():
        optimizer.zero_grad()
        losses = step_losses(model, step)
        (sum(losses) / len(losses)).backward()
        optimizer.step()
        expected.append(sum(loss.item() for loss in losses) / len(losses))
    with torch.no_grad():
        untrained = step_losses(GPTModel(VARYING), varying_length_batches()[-1])
    assert abs(expected[-1] - sum(loss.item() for loss in untrained) / 2) > 1e-3  # updates matter (tolerance: 4e-5)

    for losses, layers_per_stage in run_on_ranks(pipeline_with_varying_lengths, 4):
        assert losses == pytest.approx(expected, rel=1e-5)
        assert layers_per_stage == [2, 1]  # 3 layers on 2 stages: uneven, and reported


# --- initialisation shared by every layout ---------------------------------------------------------------

def test_pieces_initialise_from_their_own_seed_whoever_builds_them():
    torch.manual_seed(0)
    model = GPTModel(VARYING)
    torch.manual_seed(1)  # the caller's random state does not matter...
    with seeded_init(VARYING, layer_piece(2)):
        alone = TransformerLayer(VARYING)  # ...nor whether the layer is built alone, as a pipeline stage does
    for name, tensor in alone.state_dict().items():
        assert torch.equal(tensor, model.layers[2].state_dict()[name]), name
    assert not torch.equal(model.layers[1].mlp.dense_h_to_4h.weight, model.layers[2].mlp.dense_h_to_4h.weight)
    torch.manual_seed(1)
    GPTModel(VARYING)
    drawn_after_building = torch.rand(())
    torch.manual_seed(1)
    assert torch.equal(drawn_after_building, torch.rand(()))  # building drew nothing from the caller's stream
    other_seed = GPTModel(GPTConfig(**{**VARYING.__dict__, "init_seed": 6}))
    assert not torch.equal(other_seed.embedding.word_embeddings.weight, model.embedding.word_embeddings.weight)


# --- layouts that cannot work ----------------------------------------------------------------------------

def validated(*flags, world_size):
    argv = [*TINY_FLAGS, "--micro-batch-size", "2", "--train-iters", "5", "--mock-data", *flags]
    return validate_args(parse_args(argv), world_size, "cpu")


@pytest.mark.parametrize("flags, world_size, expected", [
    (["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"], 2,
     ["needs at least 4 processes", "world size is 2", "--nproc_per_node 4"]),
    (["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"], 6,
     ["world size 6 is not divisible by", "= 4", "multiple of 4"]),
    (["--pipeline-model-parallel-size", "4"], 4,
     ["--pipeline-model-parallel-size 4 is more than --num-layers 2", "every pipeline stage needs a transformer"]),
    (["--pipeline-model-parallel-size", "2", "--zero-stage", "2"], 2,
     ["--zero-stage 2 with --pipeline-model-parallel-size 2", "only ZeRO stages 0 and 1"]),
    (["--zero-stage", "3"], 1, ["--zero-stage 3", "add --no-pipeline-parallel"]),
    (["--no-pipeline-parallel", "--pipeline-model-parallel-size", "2"], 2,
     ["--no-pipeline-parallel contradicts --pipeline-model-parallel-size 2"]),
], ids=["fewer-processes-than-tp-x-pp", "world-not-divisible", "more-stages-than-layers", "zero2-with-pp",
        "zero3-with-pipeline-engine", "plain-model-with-pp"])
def test_impossible_layouts_are_refused_with_a_fix(flags, world_size, expected):
    with pytest.raises(InputError) as caught:
        validated(*flags, world_size=world_size)
    for part in expected:
        assert part in str(caught.value), str(caught.value)


def test_uneven_layer_split_is_allowed():
    assert validated("--num-layers", "3", "--pipeline-model-parallel-size", "2", world_size=2).data_parallel_size == 1


def test_engine_config_for_the_pipeline(tmp_path):
    from megatron.config.ds_config import STEPS_PER_PRINT_NEVER
    from megatron.config.arguments import job_config
    from megatron.training.loop import engine_config

    args = job_config(validated("--log-interval", "7", world_size=1))
    config = engine_config(args, pipelined=True, clipping_ourselves=True)
    assert config["pipeline"] == {"pipe_partitioned": False, "grad_partitioned": False}
    assert config["steps_per_print"] == 7 and config["gradient_clipping"] == 0.0
    plain = engine_config(args, pipelined=False, clipping_ourselves=False)
    assert "pipeline" not in plain and plain["steps_per_print"] == STEPS_PER_PRINT_NEVER
    assert plain["gradient_clipping"] == 1.0

    user_json = tmp_path / "ds.json"
    user_json.write_text(json.dumps({"pipeline": {"pipe_partitioned": True}}))
    args = job_config(validated("--deepspeed_config", str(user_json), world_size=1))
    with pytest.raises(InputError, match=f"--deepspeed_config {user_json} sets pipeline.pipe_partitioned=true"):
        engine_config(args, pipelined=True, clipping_ourselves=False)


def test_zeros_reduce_bucket_holds_at_most_the_ranks_parameters_unless_the_user_sizes_it():
    """DeepSpeed allocates the whole bucket every backward (tests/planning/test_planner_against_measured.py measures it)."""
    from megatron.config.arguments import job_config
    from megatron.training.loop import engine_config

    def bucket(*flags, parameters=1000):
        args = job_config(validated("--zero-stage", "1", *flags, world_size=1))
        return engine_config(args, pipelined=True, clipping_ourselves=False,
                             rank_parameters=parameters)["zero_optimization"].get("reduce_bucket_size")

    assert bucket() == 1000 and bucket(parameters=10 ** 10) == 500_000_000  # DeepSpeed's default above it
    assert bucket("--zero-reduce-bucket-size", "4096") == 4096
    args = job_config(validated("--zero-stage", "0", world_size=1))
    assert "reduce_bucket_size" not in engine_config(args, pipelined=False, clipping_ourselves=False,
                                                     rank_parameters=1000)["zero_optimization"]
