"""Upstream's GPT example scripts train here unchanged but for sizes: their flag sets (Megatron-DeepSpeed b4d4a0e's
examples/, written out from reading the scripts and shrunk to CPU sizes), DeepSpeed activation checkpointing
against torch's and no recomputation, and the deepspeed launcher's --local_rank contract with real processes.

Shrinking is limited to: model and batch sizes, iteration/sample/token counts and intervals, paths, --fp16
dropped (CPU has no fp16 training) with the JSON's fp16 section off to match, nccl replaced by gloo,
--num-workers 0 where upstream keeps 2 data-loader workers (pretrain_gpt.sh keeps them), and JSONs whose batch
sizes upstream leaves contradicting the flags made to agree.
"""
import contextlib
import io
import json
import logging
import os
import subprocess
import sys

import pytest
import sentencepiece
from tests.helpers.distributed import free_port, run_on_ranks

from megatron.config.learning_rates import learning_rate
from megatron.tokenizer.gpt2_bpe import EOD_TOKEN, bytes_to_unicode
from megatron.training.log_lines import parse_log
from tests.helpers.paths import PACKAGE_ROOT

pytestmark = pytest.mark.full  # multi-process / whole-run tests: the full tier

ROOT = PACKAGE_ROOT
MODEL = "--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32"

# Flag sets, one per upstream script; {data}, {vocab}, {merges}, {out} and {ds_config} are filled per run.
PRETRAIN_GPT_SH = f"""{MODEL} --micro-batch-size 4 --global-batch-size 8 --train-iters 2 --lr-decay-iters 320
    --save {{out}}/ckpt --load {{out}}/ckpt --data-path {{data}} --vocab-file {{vocab}} --merge-file {{merges}}
    --data-impl mmap --split 949,50,1 --distributed-backend gloo --lr 0.00015 --min-lr 1.0e-5 --lr-decay-style cosine
    --weight-decay 1e-2 --clip-grad 1.0 --lr-warmup-fraction .01 --checkpoint-activations --log-interval 1
    --save-interval 10000 --eval-interval 1000 --eval-iters 1"""

# examples/MoE/ds_pretrain_gpt_350M_dense.sh (EP_SIZE=1: dense, MoE flags at one expert); token-based LR and
# budget: 3 iterations of 4 x 32 tokens reach --train-tokens before --train-samples' 9.
MOE_DENSE_SH = f"""--override-lr-scheduler --adam-beta1 0.9 --adam-beta2 0.95 --tensor-model-parallel-size 1
    --moe-expert-parallel-size 1 --num-experts 1 --moe-loss-coeff 0.01 --moe-train-capacity-factor 1.0
    --moe-eval-capacity-factor 1.0 --moe-min-capacity 4 --init-method-std 0.014 --lr-decay-tokens 2560
    --lr-warmup-tokens 256 --micro-batch-size 2 --exit-duration-in-mins 30000000 --global-batch-size 4 {MODEL}
    --train-tokens 384 --train-samples 36
    --lr 3.0e-4 --min-lr 3.0e-5 --lr-decay-style cosine --split 98,2,0 --log-interval 1 --eval-interval 100
    --eval-iters 1 --save-interval 1000 --weight-decay 0.1 --clip-grad 1.0 --hysteresis 2 --num-workers 0
    --load {{out}}/ckpt --save {{out}}/ckpt --tensorboard-queue-size 1 --log-timers-to-tensorboard
    --log-batch-size-to-tensorboard --log-validation-ppl-to-tensorboard --tensorboard-dir {{out}}/tb
    --checkpoint-activations --vocab-file {{vocab}} --merge-file {{merges}} --data-path {{data}} --data-impl mmap
    --deepspeed --deepspeed_config {{ds_config}} --pipeline-model-parallel-size 1
    --deepspeed-activation-checkpointing"""
MOE_DENSE_JSON = {  # ds_config_gpt_TEMPLATE.json as the script's sed fills it (ZERO_STAGE 0, CL off)
    "train_batch_size": 4, "train_micro_batch_size_per_gpu": 2, "steps_per_print": 1,
    "zero_optimization": {"stage": 0, "elastic_checkpoint": True}, "gradient_clipping": 1.0,
    "prescale_gradients": True, "fp16": {"enabled": False, "loss_scale": 0, "loss_scale_window": 500,
                                         "hysteresis": 2, "min_loss_scale": 1, "initial_scale_power": 11},
    "bf16": {"enabled": False}, "curriculum_learning": {
        "enabled": False, "curriculum_type": "seqlen", "min_difficulty": 8, "max_difficulty": 32,
        "schedule_type": "fixed_linear", "schedule_config": {"total_curriculum_step": 10, "difficulty_step": 8}},
    "wall_clock_breakdown": False}

# examples/MoE/ds_pretrain_gpt_125M_MoE64.sh (mixture of experts: 64 experts shrunk to 4 on one process, so
# EP_PARALLEL_SIZE = NUM_GPUS = 1), with its JSON as MOE_DENSE_JSON; --deepspeed-activation-checkpointing recomputes
# through DeepSpeed's reentrant checkpoint, which the MoE losses must survive.
MOE_125M_SH = MOE_DENSE_SH.replace("--num-experts 1", "--num-experts 4").replace(
    "--checkpoint-activations", "--checkpoint-activations --create-moe-param-group --no-pipeline-parallel")

# examples/curriculum_learning/ds_pretrain_gpt2.sh with its baseline config (curriculum learning off).
CURRICULUM_BASELINE_SH = f"""--tensor-model-parallel-size 1 {MODEL} --micro-batch-size 4 --global-batch-size 4
    --train-iters 2 --train-tokens 100000 --lr-decay-tokens 1024 --save {{out}}/ckpt --load {{out}}/ckpt
    --data-path {{data}} --vocab-file {{vocab}} --merge-file {{merges}} --data-impl mmap --split 949,50,1
    --distributed-backend gloo --override-lr-scheduler --lr 1.5e-4 --lr-decay-style cosine --min-lr 1.0e-5
    --weight-decay 1e-2 --clip-grad 1.0 --lr-warmup-iters 1 --checkpoint-activations --log-interval 1
    --save-interval 1000 --eval-interval 100 --eval-iters 1 --seed 1234 --tensorboard-queue-size 1
    --log-timers-to-tensorboard --log-batch-size-to-tensorboard --log-validation-ppl-to-tensorboard
    --no-masked-softmax-fusion --tensorboard-dir {{out}}/tb --deepspeed --deepspeed_config {{ds_config}}
    --zero-stage 1 --pipeline-model-parallel-size 1 --deepspeed-activation-checkpointing --num-workers 0"""
# ds_zero_stage_1_config_baseline.json, less its "optimizer" section: upstream's DeepSpeed ignores it (Megatron
# passes its own optimizer, here with betas 0.9/0.999 from the flags, not the section's 0.9/0.95), and this
# trainer refuses such a section rather than ignore it silently.
CURRICULUM_BASELINE_JSON = {
    "train_batch_size": 4, "gradient_accumulation_steps": 1, "steps_per_print": 1, "zero_optimization": {"stage": 1},
    "gradient_clipping": 1.0, "fp16": {"enabled": False, "loss_scale": 0, "loss_scale_window": 1000,
                                       "hysteresis": 2, "min_loss_scale": 1},
    "wall_clock_breakdown": False, "zero_allow_untested_optimizer": False}

# examples/pretrain_gpt3_175B.sh: batch-size ramp-up over a three-way blend. Ramp 1 -> 4 by 3 over 2 samples:
# batch sizes 1, 1, then 4 (gradient accumulation 1 -> 4 after two steps) up to --train-samples 14.
GPT3_175B_SH = f"""--tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 {MODEL} --micro-batch-size 1
    --global-batch-size 4 --rampup-batch-size 1 3 2 --train-samples 14 --lr-decay-samples 12 --lr-warmup-samples 2
    --lr 6.0e-5 --min-lr 6.0e-6 --lr-decay-style cosine --log-interval 1 --eval-iters 1 --eval-interval 1000
    --data-path 0.2 {{data}} 0.3 {{data}} 0.5 {{data}} --vocab-file {{vocab}} --merge-file {{merges}}
    --save-interval 1000 --save {{out}}/ckpt --load {{out}}/ckpt --split 98,2,0 --clip-grad 1.0 --weight-decay 0.1
    --adam-beta1 0.9 --adam-beta2 0.95 --init-method-std 0.006 --tensorboard-dir {{out}}/tb --checkpoint-activations
    --num-workers 0"""

# Not an upstream script: the remaining behaviour flags in one bf16 run and one fp32 ZeRO-0 run.
BF16_FEATURES = f"""{MODEL} --micro-batch-size 2 --global-batch-size 4 --train-iters 3 --lr 1e-3 --data-path {{data}}
    --vocab-file {{vocab}} --merge-file {{merges}} --split 98,2,0 --eval-iters 0 --log-interval 1 --num-workers 0
    --bf16 --fp32-residual-connection --optimizer sgd --sgd-momentum 0.5 --data-impl cached --dataloader-type cyclic
    --init-method-xavier-uniform --layernorm-epsilon 1e-6 --log-params-norm --no-masked-softmax-fusion
    --attention-softmax-in-fp32 --no-bias-gelu-fusion --no-bias-dropout-fusion --no-gradient-accumulation-fusion
    --use-flash-attn --use-cpu-initialization --DDP-impl torch --mmap-warmup"""
FP32_ZERO0_FEATURES = f"""{MODEL} --micro-batch-size 2 --global-batch-size 4 --train-iters 4 --lr 1e-3
    --data-path {{data}} --vocab-file {{vocab}} --merge-file {{merges}} --split 90,10,0 --eval-iters 1 --eval-interval 2
    --log-interval 2 --num-workers 0 --zero-stage 0 --log-num-zeros-in-grad --log-params-norm
    --tensorboard-dir {{out}}/tb --log-optimizer-states-to-tensorboard --log-memory-to-tensorboard
    --log-timers-to-tensorboard --timing-log-level 2 --log-batch-size-to-tensorboard
    --log-validation-ppl-to-tensorboard --tensorboard-log-interval 2 --data-impl lazy
    --no-log-loss-scale-to-tensorboard --checkpoint-activations --deepspeed-activation-checkpointing
    --partition-activations --contigious-checkpointing"""

# examples_deepspeed/pretrain_llama2_distributed.sh (upstream main): its Llama switches, GPTSentencePieceTokenizer
# and DeepSpeed JSON (bf16, ZeRO 0) at TP 2 x PP 2 shrunk to one process; NUM_KV_HEADS 4 of 16 heads -> 2 of 4.
LLAMA2_SH = f"""--tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 --num-layers 2 --hidden-size 32
    --ffn-hidden-size 48 --num-attention-heads 4 --micro-batch-size 2 --global-batch-size 4 --seq-length 32
    --max-position-embeddings 32 --train-iters 2 --save {{out}}/ckpt --load {{out}}/ckpt --data-path {{data}}
    --data-impl mmap --tokenizer-type GPTSentencePieceTokenizer --tokenizer-model {{sentencepiece}} --split 949,50,1
    --distributed-backend gloo --lr 3e-4 --lr-decay-style cosine --min-lr 3e-5 --weight-decay 0.1 --clip-grad 1
    --lr-warmup-iters 1 --optimizer adam --adam-beta1 0.9 --adam-beta2 0.95 --log-interval 1 --save-interval 10000
    --eval-interval 1000 --eval-iters 1 --bf16 --no-query-key-layer-scaling --attention-dropout 0 --hidden-dropout 0
    --use-rotary-position-embeddings --untie-embeddings-and-output-weights --swiglu --normalization rmsnorm
    --disable-bias-linear --num-key-value-heads 2 --zero-stage=0 --deepspeed_config={{ds_config}} --deepspeed
    --num-workers 0"""
LLAMA2_JSON = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2, "steps_per_print": 1,
               "zero_optimization": {"stage": 0}, "bf16": {"enabled": True}}

# Checkpoint contents: a run saved without random states, then resumed with --reset-iteration.
CHECKPOINT_CONTENTS = f"""{MODEL} --micro-batch-size 2 --global-batch-size 4 --train-iters 2 --lr 1e-3
    --data-path {{data}} --vocab-file {{vocab}} --merge-file {{merges}} --split 98,2,0 --eval-iters 0 --log-interval 1
    --num-workers 0 --save {{out}}/../ckpt_contents --save-interval 2"""

SINGLE_PROCESS_SETS = {"pretrain_gpt.sh": (PRETRAIN_GPT_SH, None), "MoE dense": (MOE_DENSE_SH, MOE_DENSE_JSON),
                       "MoE 125M-MoE64": (MOE_125M_SH, MOE_DENSE_JSON),
                       "curriculum baseline": (CURRICULUM_BASELINE_SH, CURRICULUM_BASELINE_JSON),
                       "gpt3 175B": (GPT3_175B_SH, None),
                       "gpt3 175B, plain engine": (GPT3_175B_SH + " --no-pipeline-parallel", None),
                       "bf16 features": (BF16_FEATURES, None),
                       "pretrain_llama2_distributed.sh": (LLAMA2_SH, LLAMA2_JSON),
                       "fp32 ZeRO-0 features": (FP32_ZERO0_FEATURES, None),
                       "save without rng": (CHECKPOINT_CONTENTS + " --no-save-rng", None),
                       "resume with reset iteration": (CHECKPOINT_CONTENTS + " --load {out}/../ckpt_contents "
                                                       "--reset-iteration --save {out}/ckpt", None)}


def write_byte_level_vocab(directory):
    """A GPT-2 vocab.json / merges.txt pair with the 256 byte tokens (ids 0..255), no merges, and
    <|endoftext|> = 256: enough for GPT2BPETokenizer, and the test data's ids are all below 200."""
    vocab = {char: byte for byte, char in bytes_to_unicode().items()}
    vocab[EOD_TOKEN] = 256
    (directory / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (directory / "merges.txt").write_text("#version: 0.2\n", encoding="utf-8")
    return str(directory / "vocab.json"), str(directory / "merges.txt")


@pytest.fixture(scope="module")
def files(data_prefix, tmp_path_factory):
    """The data and the vocab files the scripts point at."""
    directory = tmp_path_factory.mktemp("vocab")
    vocab, merges = write_byte_level_vocab(directory)
    return {"data": data_prefix, "vocab": vocab, "merges": merges,
            "sentencepiece": write_sentencepiece_model(directory / "tokenizer.model")}


def write_sentencepiece_model(path):
    """A byte-fallback BPE SentencePiece model of 300 pieces (the official Llama tokenizer.model is not
    redistributable); the test data's ids are all below 200."""
    model = io.BytesIO()
    words = [" ".join(f"w{index * step % 97}" for index in range(40)) for step in range(1, 60)]
    sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(words), model_writer=model, vocab_size=300,
                                             model_type="bpe", byte_fallback=True, minloglevel=2)
    path.write_bytes(model.getvalue())
    return str(path)


def flag_set(template, files, out, ds_json=None):
    os.makedirs(out, exist_ok=True)
    ds_config = os.path.join(out, "ds_config.json")
    if ds_json is not None:
        with open(ds_config, "w") as handle:
            json.dump(ds_json, handle)
    return template.format(out=out, ds_config=ds_config, **files).split()


def train_each(argvs):
    """pretrain() once per command line in this process; each run's log (ours, as run_cli shows it, and
    DeepSpeed's prints) and its losses."""
    from megatron.model.provider import model_provider
    from megatron.training.loop import pretrain

    ours = logging.getLogger("megatron")
    ours.setLevel(logging.INFO)
    outcomes = []
    for argv in argvs:
        stdout = io.StringIO()
        handler = logging.StreamHandler(stdout)
        ours.addHandler(handler)
        try:
            with contextlib.redirect_stdout(stdout):
                result = pretrain(model_provider, argv)
        finally:
            ours.removeHandler(handler)
        outcomes.append((stdout.getvalue(), result.losses))
    return outcomes


@pytest.fixture(scope="module")
def single_process_runs(files, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    argvs = [flag_set(template, files, str(out / name.replace(" ", "_")), ds_json)
             for name, (template, ds_json) in SINGLE_PROCESS_SETS.items()]
    outcomes = run_on_ranks(train_each, 1, argvs, timeout=600)[0]
    return {name: (str(out / name.replace(" ", "_")), *outcome) for name, outcome in zip(SINGLE_PROCESS_SETS, outcomes)}


@pytest.mark.parametrize("name", list(SINGLE_PROCESS_SETS))
def test_upstream_flag_set_trains_on_cpu(single_process_runs, name):
    _, stdout, losses = single_process_runs[name]
    records = parse_log(stdout).iterations
    assert records and len(losses) == records[-1].iteration and all(0 < loss < 10 for loss in losses), stdout
    assert " > number of parameters on (tensor, pipeline) model parallel rank (0, 0): " in stdout
    if name.startswith("MoE 125M"):  # upstream's `moe loss` beside the lm loss
        assert all(record.moe_loss > 0 and record.dropped_tokens >= 0 for record in records), stdout


def test_flash_attention_flags_say_which_kernel_runs(single_process_runs):
    _, stdout, _ = single_process_runs["bf16 features"]  # --use-flash-attn
    assert stdout.count("--use-flash-attn*: upstream's FlashAttention package is not used; attention runs on ") == 1
    _, stdout, _ = single_process_runs["gpt3 175B"]
    assert "FlashAttention" not in stdout


def test_token_budget_and_token_schedule(single_process_runs):
    _, stdout, _ = single_process_runs["MoE dense"]
    records = parse_log(stdout).iterations
    assert [(r.iteration, r.consumed_samples) for r in records] == [(1, 4), (2, 8), (3, 12)]  # 384 tokens
    for record in records:
        expected = learning_rate(record.consumed_samples, max_lr=3e-4, min_lr=3e-5, warmup_samples=0,
                                 decay_samples=36, decay_style="cosine", tokens_per_sample=32, warmup_tokens=256,
                                 decay_tokens=2560)
        assert record.learning_rate == pytest.approx(expected, rel=1e-3)


def test_batch_size_ramp_drives_data_and_schedule(single_process_runs):
    _, stdout, losses = single_process_runs["gpt3 175B"]
    records = parse_log(stdout).iterations
    assert [(r.global_batch_size, r.consumed_samples) for r in records] == [(1, 1), (1, 2), (4, 6), (4, 10), (4, 14)]
    assert records[-1].train_iters == 5
    # The plain engine accumulates the same micro-batches into the same steps (fp32, dropout 0 in both).
    assert single_process_runs["gpt3 175B, plain engine"][2] == pytest.approx(losses, rel=1e-5)
    for record in records:
        expected = learning_rate(record.consumed_samples, max_lr=6e-5, min_lr=6e-6, warmup_samples=2,
                                 decay_samples=12, decay_style="cosine")
        assert record.learning_rate == pytest.approx(expected, rel=1e-3)


def test_log_fields_and_timers_of_the_logging_flags(single_process_runs):
    _, stdout, _ = single_process_runs["fp32 ZeRO-0 features"]
    records = parse_log(stdout).iterations
    assert [r.iteration for r in records] == [2, 4]
    assert all(r.num_zeros is not None and r.params_norm > 0 for r in records)
    assert stdout.count("time (ms) | train-step: ") == 2
    _, bf16_stdout, _ = single_process_runs["bf16 features"]
    assert all(r.params_norm > 0 and r.num_zeros is None for r in parse_log(bf16_stdout).iterations)


def test_no_save_rng_and_reset_iteration(single_process_runs):
    from megatron.checkpoint.client_state import has_rng, tracker_states
    from megatron.checkpoint.formats.detect import read_client_state
    from megatron.checkpoint.formats.locate import checkpoint_directory

    out, _, _ = single_process_runs["save without rng"]
    state = read_client_state(checkpoint_directory(os.path.join(out, "..", "ckpt_contents")))
    assert state["iteration"] == 2 and not has_rng(state) and tracker_states(state) is None
    _, stdout, _ = single_process_runs["resume with reset iteration"]
    assert [(r.iteration, r.consumed_samples) for r in parse_log(stdout).iterations] == [(1, 4), (2, 8)]


UPSTREAM_TAGS = ["steps-vs-samples/y=steps,x=samples", "steps-vs-samples/y=samples,x=steps",
                 "steps-vs-tokens/y=steps,x=tokens", "steps-vs-tokens/y=tokens,x=steps"] + [
    f"{tag}{twin}" for tag in ("learning-rate/learning-rate", "lm-loss-training/lm loss", "grad-norm/grad-norm",
                               "num-zeros/num-zeros", "params-norm/params-norm", "iteration-time/iteration-time",
                               "lm-loss-validation/lm loss validation", "lm-loss-validation/lm loss validation ppl")
    for twin in ("", " vs samples", " vs tokens")] + [
    "batch-size/batch-size", "batch-size/batch-size vs samples", "train-step-time", "evaluate-time",
    "mem-allocated-bytes"] + [f"optimizer/{name}{twin}" for name in (
        "variance_l2", "variance_sqrt_l2", "momentum_l2", "weight_l2", "variance_l1", "variance_sqrt_l1", "momentum_l1",
        "weight_l1", "variance_abs_max", "variance_sqrt_abs_max", "momentum_abs_max", "weight_abs_max")
        for twin in ("", " vs tokens")]


def test_tensorboard_tags_are_upstreams(single_process_runs):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, _, _ = single_process_runs["fp32 ZeRO-0 features"]
    events = EventAccumulator(os.path.join(out, "tb"))
    events.Reload()
    assert sorted(events.Tags()["scalars"]) == sorted(UPSTREAM_TAGS)  # no loss-scale: --no-log-loss-scale-...
    assert [event.step for event in events.Scalars("lm-loss-training/lm loss")] == [2, 4]  # every 2nd iteration
    assert [event.step for event in events.Scalars("lm-loss-training/lm loss vs samples")] == [8, 16]
    assert [event.step for event in events.Scalars("lm-loss-training/lm loss vs tokens")] == [256, 512]
    assert [event.step for event in events.Scalars("lm-loss-validation/lm loss validation ppl")] == [2, 4]
    assert [event.value for event in events.Scalars("batch-size/batch-size")] == [4, 4]


# --- two processes: upstream's model-parallel script, and recomputation parity ---------------------------------

# examples/pretrain_gpt_distributed_with_mp.sh: TP 2 x PP 2 needs four processes; shrunk to PP 2 on two.
DISTRIBUTED_WITH_MP_SH = f"""--tensor-model-parallel-size 1 --pipeline-model-parallel-size 2 {MODEL}
    --micro-batch-size 2 --global-batch-size 4 --train-iters 2 --lr-decay-iters 320 --save {{out}}/ckpt
    --load {{out}}/ckpt --data-path {{data}} --vocab-file {{vocab}} --merge-file {{merges}} --data-impl mmap
    --split 949,50,1 --distributed-backend gloo --lr 0.00015 --lr-decay-style cosine --min-lr 1.0e-5
    --weight-decay 1e-2 --clip-grad 1.0 --lr-warmup-fraction .01 --checkpoint-activations --log-interval 1
    --save-interval 10000 --eval-interval 1000 --eval-iters 1 --num-workers 0"""

# TP 2 with dropout: a recomputed forward must redraw the same masks from the replayed random streams (the
# model-parallel one included), so per engine every variant trains exactly like the first, which recomputes
# nothing. The engines draw dropout in different orders, so each is compared with itself.
RECOMPUTE = f"""{MODEL} --micro-batch-size 2 --global-batch-size 4 --train-iters 2 --lr 1e-2 --data-path {{data}}
    --vocab-file {{vocab}} --merge-file {{merges}} --split 98,2,0 --eval-iters 0 --log-interval 1 --num-workers 0
    --tensor-model-parallel-size 2 --hidden-dropout 0.1 --attention-dropout 0.1 --seed 5"""
RECOMPUTE_VARIANTS = {
    "plain engine": ["--no-pipeline-parallel", "--no-pipeline-parallel --checkpoint-activations",
                     "--no-pipeline-parallel --checkpoint-activations --checkpoint-num-layers 2 "
                     "--deepspeed-activation-checkpointing --partition-activations --checkpoint-in-cpu "
                     "--synchronize-each-layer --profile-backward"],
    "pipeline engine": ["", "--checkpoint-activations --deepspeed-activation-checkpointing --partition-activations"]}


@pytest.fixture(scope="module")
def two_process_runs(files, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("two_processes"))
    variants = [variant for engine in RECOMPUTE_VARIANTS.values() for variant in engine]
    argvs = [flag_set(DISTRIBUTED_WITH_MP_SH, files, out)] + [
        flag_set(RECOMPUTE, files, out) + variant.split() for variant in variants]
    ranks = run_on_ranks(train_each, 2, argvs, timeout=600)
    recompute_losses = dict(zip(variants, (losses for _, losses in ranks[0][1:])))
    return [rank[0][0] for rank in ranks], recompute_losses


def test_distributed_with_mp_script_trains_on_two_processes(two_process_runs):
    (first_stage, last_stage), _ = two_process_runs
    assert [r.iteration for r in parse_log(last_stage).iterations] == [1, 2]  # the last rank prints the log
    assert " > number of parameters on (tensor, pipeline) model parallel rank (0, 0): " in first_stage
    assert " > number of parameters on (tensor, pipeline) model parallel rank (0, 1): " in last_stage


def test_deepspeed_activation_checkpointing_recomputes_exactly(two_process_runs):
    _, losses = two_process_runs
    for reference, *recomputing in RECOMPUTE_VARIANTS.values():
        assert len(losses[reference]) == 2
        for variant in recomputing:
            assert losses[variant] == pytest.approx(losses[reference], rel=1e-6), variant


# examples/run_deepspeed_example.sh through the deepspeed launcher (its JSON's train_batch_size 64 against
# --global-batch-size 1024 made to agree).
RUN_DEEPSPEED_EXAMPLE_SH = f"""--tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 {MODEL}
    --loss-scale 12 --micro-batch-size 2 --global-batch-size 8 --train-iters 2 --lr 6.0e-5 --min-lr 6.0e-6
    --lr-decay-style cosine --log-interval 1 --eval-iters 1 --eval-interval 1000 --data-path {{data}}
    --vocab-file {{vocab}} --merge-file {{merges}} --save-interval 1000 --split 98,2,0 --clip-grad 1.0
    --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.95 --init-method-std 0.006 --checkpoint-activations
    --num-workers 0 --tensorboard-dir {{out}} --deepspeed-activation-checkpointing --zero-stage=2
    --deepspeed_config={{ds_config}} --no-pipeline-parallel --deepspeed --exit-interval 5000"""
RUN_DEEPSPEED_EXAMPLE_JSON = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "steps_per_print": 1,
                              "zero_optimization": {"stage": 2},
                              "fp16": {"enabled": False, "initial_scale_power": 12}, "wall_clock_breakdown": True}


def test_deepspeed_launcher_passes_local_rank_and_training_runs(files, tmp_path):
    """`deepspeed --num_gpus 2 pretrain_gpt.py ...` starts each process with --local_rank=N plus RANK,
    LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (DeepSpeed's launcher works on CPU too)."""
    launcher = os.path.join(os.path.dirname(sys.executable), "deepspeed")
    argv = flag_set(RUN_DEEPSPEED_EXAMPLE_SH, files, str(tmp_path), RUN_DEEPSPEED_EXAMPLE_JSON)
    env = {key: value for key, value in os.environ.items()
           if key not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    result = subprocess.run([launcher, "--num_gpus", "2", "--master_port", str(free_port()), "pretrain_gpt.py",
                             *argv], capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "'--local_rank=0'" in result.stdout + result.stderr and "'--local_rank=1'" in result.stdout + result.stderr
    assert [r.iteration for r in parse_log(result.stdout).iterations] == [1, 2]
