"""The training loop's own decisions (megatron/training/loop.py), without training: the DeepSpeed config it hands
the engine (clipping, the bf16 overflow check, the pipeline's partitioning, the universal loader, the reduce bucket,
evaluation's stage), the learning-rate schedule and its refusal, the --train-tokens budget, and micro-batches that
restart their loader. Whole runs through pretrain(): test_parallel_training.py, test_pipeline.py and the rest."""
import json
from dataclasses import replace

import pytest
import torch

from megatron.config.arguments import build_job_config
from megatron.errors import InputError
from megatron.training.loop import (Batches, capped_reduce_bucket, engine_config, evaluation_engine_config,
                                    learning_rate_schedule, tokens_budget_spent)
from tests.helpers.flag_groups import resolved


def job(*argv, world_size=1):
    return build_job_config(resolved(*argv, world_size=world_size))


def test_the_engine_config_for_this_loop():
    config = job("--log-interval", "5", world_size=2)  # ZeRO 1 over two data-parallel ranks
    plain = engine_config(config, pipelined=False, clipping_ourselves=False, rank_parameters=1000)
    assert plain["zero_optimization"]["reduce_bucket_size"] == 1000 and plain["gradient_clipping"] == 1.0
    assert plain["timers"] == {"throughput": {"enabled": False}} and "pipeline" not in plain
    ours = engine_config(config, pipelined=True, clipping_ourselves=True, universal_load=True,
                         guarding_steps_ourselves=True)
    assert ours["gradient_clipping"] == 0.0 and ours["bf16"]["check_grad_overflow"] is False
    assert ours["checkpoint"]["load_universal"] is True
    assert ours["pipeline"] == {"pipe_partitioned": False, "grad_partitioned": False}
    assert ours["steps_per_print"] == 5
    assert capped_reduce_bucket(10 ** 12) == 500_000_000


def write_json(tmp_path, content) -> str:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(content))
    return str(path)


def test_deepspeed_keys_this_loop_cannot_honour_are_one_line(tmp_path):
    path = write_json(tmp_path, {"pipeline": {"pipe_partitioned": True}})
    with pytest.raises(InputError, match=f"^--deepspeed_config {path} sets pipeline.pipe_partitioned=true, but"):
        engine_config(job("--deepspeed_config", path), pipelined=True, clipping_ourselves=False)
    path = write_json(tmp_path, {"zero_optimization": {"stage": 1, "compute_grad_norm": False}})
    with pytest.raises(InputError, match="sets zero_optimization.compute_grad_norm=false, but a bf16 ZeRO step"):
        engine_config(job("--deepspeed_config", path), pipelined=False, clipping_ourselves=False,
                      guarding_steps_ourselves=True)


def test_evaluation_runs_zero_1_and_2_at_stage_0():
    assert evaluation_engine_config(job(world_size=2), False, False)["zero_optimization"]["stage"] == 0


def test_the_schedule_and_a_decay_that_ends_inside_the_warmup():
    schedule = job("--lr-warmup-iters", "2", "--global-batch-size", "2").schedule  # warmup 4 samples, decay 20
    rate = learning_rate_schedule(schedule)
    assert rate(0) == 0.0 and rate(2) == pytest.approx(5e-4) and rate(4) == pytest.approx(1e-3)
    assert rate(20) == pytest.approx(0.0)  # linear decay to --min-lr 0 over the 20 samples of 10 iterations
    with pytest.raises(InputError, match="--lr-decay-tokens 32 ends before the warmup of 4 samples \\(64 tokens\\)"):
        learning_rate_schedule(replace(schedule, decay_tokens=32))


def test_the_tokens_budget():
    schedule = job("--train-tokens", "100").schedule
    assert not tokens_budget_spent(schedule, 99) and tokens_budget_spent(schedule, 100)
    assert not tokens_budget_spent(job().schedule, 10 ** 12)


def test_batches_restart_their_loader_only_when_asked():
    loader = [{"tokens": torch.tensor([index]), "loss_mask": None} for index in range(2)]
    endless = Batches(loader, restart=True)
    assert [next(endless)["tokens"].item() for _ in range(5)] == [0, 1, 0, 1, 0]
    once = Batches(loader)
    assert [batch["tokens"].item() for batch in once] == [0, 1] and next(endless)["loss_mask"] is None
