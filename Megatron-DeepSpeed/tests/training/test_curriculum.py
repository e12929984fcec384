"""The sequence-length curriculum (config/curriculum.py, training/curriculum.py): the DeepSpeed JSON's
curriculum_learning section checked in one line; DeepSpeed's scheduler asked as upstream's loop asks it, batches cut
to its length, tokens counted as upstream counts them for the learning-rate schedule; and for real, TP2 x PP2 on
the pipeline engine growing its sequences from 64 to 128 tokens equals one process doing the same (fp32), and a
resumed run continues the curriculum where the checkpoint left it."""
import contextlib
import io
import json
import logging
from dataclasses import dataclass

import pytest
import torch
from tests.helpers.distributed import run_on_ranks
from tests.helpers.training import TINY_FLAGS

from megatron.checkpoint.formats.detect import read_client_state
from megatron.config.arguments import job_config, parse_args, validate_args
from megatron.config.curriculum import seqlen_curriculum
from megatron.config.ds_config import resolve_deepspeed_config
from megatron.config.learning_rates import learning_rate
from megatron.data.gpt_batch import make_batch, truncated_batch
from megatron.errors import InputError
from megatron.training.curriculum import SequenceLengthCurriculum
from megatron.training.log_lines import parse_log
from megatron.training.loop import (TrainState, compiled_curriculum_note, curriculum_warmup_tokens,
                                    learning_rate_schedule, resumed_curriculum)

LINEAR = {"enabled": True, "curriculum_type": "seqlen", "min_difficulty": 64, "max_difficulty": 128,
          "schedule_type": "fixed_linear", "schedule_config": {"total_curriculum_step": 3, "difficulty_step": 32}}


# --- the JSON section ----------------------------------------------------------------------------------------

def checked(section, seq_length=128, split=1):
    return seqlen_curriculum({"curriculum_learning": section}, "ds.json", seq_length, split)


def test_an_enabled_seqlen_section_is_taken_as_written_and_a_disabled_one_ignored():
    assert dict(checked(LINEAR)) == LINEAR
    assert checked({**LINEAR, "enabled": False}) is None and seqlen_curriculum({}, "ds.json", 128) is None
    discrete = {**LINEAR, "schedule_type": "fixed_discrete",
                "schedule_config": {"difficulty": [64, 96, 128], "max_step": [2, 4]}}
    assert dict(checked(discrete, split=2)) == discrete


@pytest.mark.parametrize("change, seq_length, split, expected", [
    ({"curriculum_type": "vocabularyrarity"}, 128, 1, "only the sequence-length curriculum (\"seqlen\")"),
    ({"schedule_type": "custom"}, 128, 1, "a schedule given as Python code"),
    ({"schedule_type": "fixed_cubic"}, 128, 1, "use one of fixed_linear, fixed_root, fixed_discrete"),
    ({"max_difficulty": 256}, 128, 1, "min <= max <= --seq-length 128"),
    ({"min_difficulty": 0}, 128, 1, "min_difficulty: 0 is not a positive whole number"),
    ({"schedule_config": {"total_curriculum_step": 3}}, 128, 1, "needs difficulty_step for schedule_type"),
    ({"schedule_config": {"total_curriculum_step": 3, "difficulty_step": 12}}, 128, 8,
     "difficulty_step 12, but --sequence-parallel splits every sequence over --tensor-model-parallel-size 8"),
    ({"schedule_type": "fixed_discrete", "schedule_config": {"difficulty": [64, 128], "max_step": [2, 4]}}, 128, 1,
     "a list of difficulty one longer than its non-empty list of max_step"),
    ({"schedule_type": "fixed_discrete", "schedule_config": {"difficulty": [64, 256], "max_step": [2]}}, 128, 1,
     "longer than --seq-length 128"),
    ({"schedule_type": "fixed_discrete", "schedule_config": {"difficulty": [64, 128], "max_step": [2.5]}}, 128, 1,
     "schedule_config.max_step: 2.5 is not a positive whole number"),
    ({"schedule_type": "fixed_discrete", "schedule_config": {"difficulty": [128, 64], "max_step": [2]}}, 128, 1,
     "the lengths must not decrease and the steps must increase"),
    ({"schedule_type": "fixed_discrete", "schedule_config": {"difficulty": [32, 64, 128], "max_step": [4, 2]}}, 128,
     1, "the lengths must not decrease and the steps must increase"),
    ({"enabled": "false"}, 128, 1, "sets curriculum_learning.enabled='false'; it must be true or false"),
], ids=["type", "custom", "schedule", "too-long", "zero", "missing-key", "sp-split", "discrete-lists",
        "discrete-too-long", "discrete-step", "discrete-decreasing", "discrete-steps-back", "enabled-string"])
def test_what_the_scheduler_cannot_run_is_refused_in_one_line(change, seq_length, split, expected):
    with pytest.raises(InputError, match="^--deepspeed_config ds.json") as raised:
        checked({**LINEAR, **change}, seq_length, split)
    assert expected in str(raised.value) and "\n" not in str(raised.value)


def test_a_curriculum_section_that_is_not_an_object_is_refused_not_ignored():
    with pytest.raises(InputError, match=r"^--deepspeed_config ds.json sets curriculum_learning to \[\]; it must be "
                                         r"an object"):
        checked([])


@pytest.mark.parametrize("turned_on", [None, ("data_sampling", "curriculum_learning"), ("data_routing", "random_ltd")],
                         ids=["every-part-off", "data-sampling-curriculum", "random-ltd"])
def test_the_data_efficiency_library_is_refused_once_a_part_of_it_is_on(turned_on, tmp_path):
    parts = {"data_sampling": {"enabled": False, "curriculum_learning": {"enabled": False}},
             "data_routing": {"enabled": False, "random_ltd": {"enabled": False}}}
    if turned_on:  # DeepSpeed reads each part's switch whatever its parent's says
        parts[turned_on[0]][turned_on[1]]["enabled"] = True
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"data_efficiency": {"enabled": True, **parts}}))
    config = job_config(validate_args(parse_args([*TINY_FLAGS, "--micro-batch-size", "2", "--train-iters", "2",
                                                  "--data-path", "unused", "--deepspeed_config", str(path)]), 1, "cpu"))
    if turned_on is None:  # upstream's baseline script: the library on, every part off
        assert "data_efficiency" not in resolve_deepspeed_config(config)
        return
    with pytest.raises(InputError, match="data_efficiency: Megatron-DeepSpeed's data efficiency .* is not supported"):
        resolve_deepspeed_config(config)


def test_a_curriculum_with_ulysses_sequence_parallelism_is_refused_in_one_line(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"curriculum_learning": LINEAR}))
    flags = [*TINY_FLAGS, "--micro-batch-size", "2", "--train-iters", "2", "--data-path", "unused", "--seq-length",
             "128", "--deepspeed_config", str(path), "--ds-sequence-parallel-size", "2", "--no-pipeline-parallel"]
    with pytest.raises(InputError, match="sequence-length curriculum.*--ds-sequence-parallel-size 2") as raised:
        validate_args(parse_args(flags), 2, "cpu")
    assert "\n" not in str(raised.value)


# --- the schedule, the batches, the tokens --------------------------------------------------------------------

def test_the_scheduler_is_asked_at_the_global_step_of_each_iteration():
    curriculum = SequenceLengthCurriculum(LINEAR)
    # DeepSpeed's fixed_linear: 64 + 64 x step / 3, floored to a multiple of 32, up to 128 from step 3 on
    assert [curriculum.length(iteration) for iteration in range(5)] == [64, 96, 128, 128, 128]


def test_a_batch_is_cut_to_the_curriculum_length():
    text = torch.arange(2 * 9).reshape(2, 9) % 5
    whole = make_batch(text, eod=4, reset_position_ids=True, reset_attention_mask=True, eod_mask_loss=True)
    cut = truncated_batch(whole, 5)
    shorter = make_batch(text[:, :6], eod=4, reset_position_ids=True, reset_attention_mask=True, eod_mask_loss=True)
    assert cut.keys() == shorter.keys()
    for name, tensor in shorter.items():  # what a 5-token sample would have made
        assert torch.equal(cut[name], tensor) and cut[name].is_contiguous(), name


def upstream_token_count(section, batch_sizes):
    """Upstream's loop arithmetic (megatron/training.py, train()): before each iteration the scheduler is asked at
    args.iteration + 1; after it, consumed_train_tokens += new_samples x curriculum_seqlen."""
    from deepspeed.runtime.data_pipeline.curriculum_scheduler import CurriculumScheduler

    scheduler, consumed, counts = CurriculumScheduler(dict(section)), 0, []
    for iteration, new_samples in enumerate(batch_sizes):
        consumed += new_samples * scheduler.update_difficulty(iteration + 1)
        counts.append(consumed)
    return counts


def job(*flags, tmp_path, length=("--train-iters", "6"), section=LINEAR):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"curriculum_learning": section}))
    unit = length[0].split("-")[-1]  # the warmup counts in the training length's unit
    tiny = [f"--lr-warmup-{unit}" if flag == "--lr-warmup-iters" else flag for flag in TINY_FLAGS]
    argv = [*tiny, "--seq-length", "128", "--micro-batch-size", "2", "--global-batch-size", "8", *length,
            "--data-path", "unused", "--deepspeed_config", str(path), *flags]
    return job_config(validate_args(parse_args(argv), 1, "cpu"))


def test_tokens_are_counted_per_iteration_at_its_length_as_upstream_counts_them(tmp_path):
    config = job("--rampup-batch-size", "4", "4", "16", tmp_path=tmp_path,
                 length=("--train-samples", "64"))
    sizes, samples = [], 0
    for _ in range(5):
        sizes.append(config.batch.schedule.batch_size(samples))
        samples += sizes[-1]
    assert sizes == [4, 4, 4, 4, 8]  # the ramp counts too
    upstream = upstream_token_count(LINEAR, sizes)
    assert upstream == [256, 640, 1152, 1664, 2688]
    for iterations in range(6):  # a run resumed after `iterations` iterations counts what the first run counted
        state = TrainState(iteration=iterations, consumed_train_samples=sum(sizes[:iterations]))
        curriculum, tokens = resumed_curriculum(config, state)
        assert tokens == ([0] + upstream)[iterations]
        assert curriculum.scheduler.state == SequenceLengthCurriculum(LINEAR).scheduler.state if iterations == 0 \
            else curriculum.length(iterations - 1) == [64, 96, 128, 128, 128][iterations - 1]


def test_a_resume_under_another_curriculum_is_refused_instead_of_going_back(tmp_path):
    """The checkpoint's recorded tokens replay under the section it trained with; another section (here: twice as
    many steps to grow) would shorten the sequences and recount the tokens, so it is refused in one line."""
    load = ("--load", str(tmp_path / "ck"))
    trained = job(*load, tmp_path=tmp_path)
    state = TrainState(iteration=2, consumed_train_samples=16)
    _, tokens = resumed_curriculum(trained, state)
    assert resumed_curriculum(trained, state, tokens)[1] == tokens  # the same section: resumes
    slower = {**LINEAR, "schedule_config": {"total_curriculum_step": 6, "difficulty_step": 32}}
    with pytest.raises(InputError, match=rf"^--load {tmp_path / 'ck'}: its 2 iterations consumed {tokens} tokens, but "
                                         r"this run's sequence-length curriculum .* gives \d+ for them: the "
                                         r"curriculum changed since the checkpoint was saved"):
        resumed_curriculum(job(*load, tmp_path=tmp_path, section=slower), state, tokens)


def test_a_resume_that_adds_or_drops_the_curriculum_is_refused_naming_the_section(tmp_path):
    """2 iterations of 8 samples: under LINEAR 8 x 64 + 8 x 96 = 1280 tokens, 2048 at the full --seq-length 128.
    Without the section its sequences would jump to full length (also once the curriculum ended: that section
    trains at full length then); with one it never had they would be cut back."""
    load = ("--load", str(tmp_path / "ck"))
    curriculum, plain = job(*load, tmp_path=tmp_path), job(*load, tmp_path=tmp_path, section={"enabled": False})
    state = TrainState(iteration=2, consumed_train_samples=16)
    assert resumed_curriculum(curriculum, state, 1280, 128)[1] == 1280  # the section it trained with
    with pytest.raises(InputError) as dropped:
        resumed_curriculum(plain, state, 1280, 128)
    assert str(dropped.value) == (
        f"--load {tmp_path / 'ck'}: its 2 iterations consumed 1280 tokens, fewer than their 16 samples x "
        "--seq-length 128: it trained under a sequence-length curriculum (the curriculum_learning section of "
        "--deepspeed_config) and this run has none, so its sequences would jump to full length; resume with the "
        "section it trained with (past its last step it trains at full length), or start a new schedule from its "
        "weights with --finetune")
    with pytest.raises(InputError, match=r": its 2 iterations consumed 2048 tokens, all 16 samples at --seq-length "
                                         r"128: it trained without a sequence-length curriculum, and this run's .* "
                                         r"would cut its sequences back, counting 1280 tokens for them; drop the "
                                         r"section to resume it"):
        resumed_curriculum(curriculum, state, 2048, 128)
    # Without a curriculum on either side --seq-length may change; a checkpoint that records none is not judged.
    assert resumed_curriculum(plain, state, 1024, 64) == (None, 2048)
    assert resumed_curriculum(plain, state, 1280, None) == (None, 2048)


def test_a_compiled_run_under_a_curriculum_says_once_that_it_compiles_per_length(tmp_path):
    """DeepSpeed's fixed_linear 64 -> 128 in 3 steps of 32: lengths 64, 96, 128 over 6 iterations."""
    assert compiled_curriculum_note(job(tmp_path=tmp_path), 6) is None
    assert compiled_curriculum_note(job("--torch-compile", tmp_path=tmp_path), 6) == (
        "--torch-compile with a sequence-length curriculum: the model is compiled once for each of its 3 lengths "
        "(64, 96, 128); beyond torch's recompile limit (torch._dynamo.config.recompile_limit) the remaining "
        "lengths run uncompiled")


def test_the_learning_rate_follows_the_tokens_consumed_not_samples_x_seq_length(tmp_path):
    # A sample warmup (2 iterations of 8) with a token decay: the decay starts at the tokens the warmup consumed,
    # 8 x 64 + 8 x 96, where upstream's scheduler records them, not at 16 samples x 128.
    config = job("--lr-decay-tokens", "20000", tmp_path=tmp_path)
    assert curriculum_warmup_tokens(config) == 8 * 64 + 8 * 96
    schedule = dict(max_lr=1e-2, min_lr=1e-3, warmup_samples=16, decay_samples=48, decay_style="linear",
                    tokens_per_sample=128, decay_tokens=20000)
    consumed = upstream_token_count(LINEAR, [8] * 4)[-1]  # 4 iterations: 8 x (64 + 96 + 128 + 128) tokens
    ratio = (consumed - 1280) / (20000 - 1280)
    assert learning_rate(32, consumed_tokens=consumed, warmup_end_tokens=1280, **schedule) == \
        pytest.approx(1e-3 + (1 - ratio) * 9e-3)
    assert learning_rate(32, **schedule) != pytest.approx(1e-3 + (1 - ratio) * 9e-3)  # samples x 128 differ
    # A token warmup counts the curriculum's tokens too: 640 of 1000 warmup tokens after two iterations of 4.
    assert learning_rate(8, consumed_tokens=640, **{**schedule, "warmup_tokens": 1000}) == pytest.approx(6.4e-3)
    assert curriculum_warmup_tokens(job(tmp_path=tmp_path)) is None  # no token decay: nothing to start
    # A decay of 1500 tokens ends after the curriculum's warmup (1280 tokens), not after 16 x 128 = 2048.
    shorter = job("--lr-decay-tokens", "1500", tmp_path=tmp_path)
    assert learning_rate_schedule(shorter.schedule, curriculum_warmup_tokens(shorter))(16, consumed_tokens=1280) \
        == pytest.approx(1e-2)
    with pytest.raises(InputError, match=r"ends before the warmup of 16 samples \(2048 tokens\) does"):
        learning_rate_schedule(shorter.schedule)


# --- TP2 x PP2 against one process ---------------------------------------------------------------------------

ITERATIONS = 5
# 64, 80, 96, 112, 128 tokens: fixed_linear over 5 steps in multiples of 16
GROWING = {**LINEAR, "schedule_config": {"total_curriculum_step": 5, "difficulty_step": 16}}
LENGTHS = [64, 80, 96, 112, 128]
FLAGS = [*TINY_FLAGS, "--seq-length", "128", "--micro-batch-size", "2", "--global-batch-size", "8",
         "--train-iters", str(ITERATIONS), "--log-interval", "1", "--eval-interval", "2", "--eval-iters", "1",
         "--adam-eps", "1e-4", "--clip-grad", "0.5", "--reset-attention-mask", "--reset-position-ids",
         "--lr-warmup-tokens", "600", "--lr-decay-tokens", "8000"]
# --adam-eps: see test_parallel_training.py (the attention key bias has an exactly zero true gradient).


@dataclass
class Run:
    losses: list
    validation_loss: float
    weights: dict  # rank 0's
    stdout: str  # the log lines are the last rank's


def train(argv):
    """pretrain() on this rank: its losses, log and (rank 0) the full single-process weights."""
    import torch.distributed as dist

    from tests.helpers.model_state import gather_full_state_dict
    from megatron.model.provider import model_provider
    from megatron.training.loop import pretrain

    stdout = io.StringIO()
    ours = logging.getLogger("megatron")
    ours.setLevel(logging.INFO)
    ours.addHandler(logging.StreamHandler(stdout))
    with contextlib.redirect_stdout(stdout):
        result = pretrain(model_provider, argv)
    weights = gather_full_state_dict(result.model, result.parallel)
    return Run(result.losses, result.validation_loss, weights if dist.get_rank() == 0 else None, stdout.getvalue())


def curriculum_flags(tmp_path, data_prefix):
    path = tmp_path / "curriculum.json"
    path.write_text(json.dumps({"curriculum_learning": GROWING}))
    return [*FLAGS, "--data-path", data_prefix, "--deepspeed_config", str(path)]


@pytest.mark.full
def test_tp2_pp2_grows_its_sequences_like_one_process_and_resumes_the_curriculum(data_prefix, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    flags = curriculum_flags(tmp_path, data_prefix)
    one = run_on_ranks(train, 1, [*flags, "--no-pipeline-parallel", "--tensorboard-dir", str(tmp_path / "tb")])[0]
    records = parse_log(one.stdout).iterations
    assert [record.curriculum_seqlen for record in records] == LENGTHS
    tokens = upstream_token_count(GROWING, [8] * ITERATIONS)
    assert [record.learning_rate for record in records] == pytest.approx(
        [learning_rate(8 * (index + 1), max_lr=1e-2, min_lr=1e-3, warmup_samples=16, decay_samples=40,
                       decay_style="cosine", warmup_tokens=600, decay_tokens=8000, consumed_tokens=count)
         for index, count in enumerate(tokens)], rel=1e-3)
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [event.value for event in events.Scalars("curriculum_seqlen")] == LENGTHS
    assert [event.step for event in events.Scalars("lm-loss-training/lm loss vs tokens")] == tokens
    assert [event.step for event in events.Scalars("lm-loss-validation/lm loss validation vs tokens")] == \
        [tokens[1], tokens[3], tokens[4]]

    layout = ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2", "--sequence-parallel"]
    save = tmp_path / "checkpoints"
    runs = run_on_ranks(train, 4, [*flags, *layout, "--save", str(save), "--save-interval", "2"])
    parallel = runs[0]
    assert parallel.losses == pytest.approx(one.losses, rel=1e-5)
    assert parallel.validation_loss == pytest.approx(one.validation_loss, rel=1e-5)
    for name, tensor in parallel.weights.items():
        torch.testing.assert_close(tensor, one.weights[name], rtol=1e-4, atol=1e-5, msg=name)
    assert [record.curriculum_seqlen for record in parse_log(runs[-1].stdout).iterations] == LENGTHS

    # upstream's `tokens`, from which its trainer resumes the count: 8 x 64 + 8 x 80
    assert read_client_state(str(save / "global_step2"))["tokens"] == tokens[1] == 1152

    (save / "latest").write_text("global_step2")  # resume after the 80-token iteration
    resumed = run_on_ranks(train, 4, [*flags, *layout, "--load", str(save)])
    records = parse_log(resumed[-1].stdout).iterations
    assert [(record.iteration, record.curriculum_seqlen) for record in records] == [(3, 96), (4, 112), (5, 128)]
    assert [record.learning_rate for record in records] == pytest.approx(
        [record.learning_rate for record in parse_log(runs[-1].stdout).iterations[2:]], rel=1e-6)
    assert resumed[0].losses == parallel.losses[2:]
    # Resumed without the section, its sequences would jump to 128: the trainer refuses, naming the section.
    without = flags[:flags.index("--deepspeed_config")]  # curriculum_flags puts the JSON last
    with pytest.raises(AssertionError, match=r"its 2 iterations consumed 1152 tokens, fewer than their 16 samples x "
                                             r"--seq-length 128: it trained under a sequence-length curriculum"):
        run_on_ranks(train, 4, [*without, *layout, "--load", str(save)])
