"""The tools that use a trained model, on a checkpoint written by a real (tiny) training run: generate_text.py
at TP1 and at TP2 x DP2 gives transformers' greedy output token for token, with and without the KV cache, and
the same seeded samples at any layout; pretrain_gpt.py --skip-train reports exactly the validation and test
perplexity that training printed; zero-shot evaluation at TP2 equals the single-process result; bad input
gets a clear message."""
import json
import shutil
from types import SimpleNamespace

import pytest
import torch
from tests.helpers.distributed import run_on_ranks
from tests.helpers.training import TINY_FLAGS, VOCAB, logged_lines, write_counting_dataset

from megatron.families.gpt2.hf_adapter import hf_config, to_hf_tensors
from megatron.checkpoint.formats.reader import read_checkpoint
from megatron.checkpoint.trainer.load import plan_load
from megatron.config.arguments import job_config, parse_args, validate_args
from megatron.errors import InputError
from megatron.evaluation.zeroshot import wikitext_perplexity
from megatron.inference.generation import generate_batch
from megatron.inference.loading import load_model
from megatron.inference.sampling import SamplingParams
from megatron.model.gpt_config import gpt_config
from megatron.model.kernels import PORTABLE_KERNELS
from megatron.tokenizer.null_tokenizer import NullTokenizer
from megatron.training.log_lines import parse_log

pytestmark = pytest.mark.full  # multi-process / whole-run tests: the full tier

ITERATIONS = 30
TRAINING = [*TINY_FLAGS, "--split", "80,10,10", "--micro-batch-size", "2", "--global-batch-size", "8",
            "--train-iters", str(ITERATIONS), "--log-interval", "10", "--eval-iters", "2",
            "--eval-interval", str(ITERATIONS), "--adam-eps", "1e-4"]
PROMPTS = ["1 2 3 4", "10 12 14 16 18 20", "150 151", "77", "30 33 36 39 42 45 48 51 54"]
NEW_TOKENS = 12


def pretrain_and_log(argv):
    """pretrain() on this rank; returns the lines it logged."""
    from megatron.model.provider import model_provider
    from megatron.training.loop import pretrain

    return logged_lines(lambda: pretrain(model_provider, argv))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    directory = tmp_path_factory.mktemp("trained")
    data = ["--data-path", write_counting_dataset(str(directory / "counting_text_document"))]
    save = str(directory / "checkpoint")
    # ZeRO 1: its optimizer state in files of its own (test_skip_train_builds_no_optimizer_... removes them)
    log = run_on_ranks(pretrain_and_log, 1, [*TRAINING, *data, "--save", save, "--save-interval", str(ITERATIONS),
                                             "--zero-stage", "1"])[0]
    prompt_file = directory / "prompts.jsonl"
    prompt_file.write_text("".join(json.dumps({"text": prompt}) + "\n" for prompt in PROMPTS))
    return SimpleNamespace(directory=directory, data=data, save=save, log=log, prompt_file=str(prompt_file))


def test_skip_train_reports_the_validation_and_test_perplexity_training_printed(trained):
    log = run_on_ranks(pretrain_and_log, 1, [*TRAINING, *trained.data, "--load", trained.save, "--skip-train"])[0]
    assert "skipping training (--skip-train is on) ..." in log
    assert not parse_log(log).iterations
    evaluated = {record.prefix: record for record in parse_log(log).validations}
    training = {record.prefix: record for record in parse_log(trained.log).validations}
    assert sorted(training) == sorted(evaluated) == ["test", "validation"]  # training evaluates the test split last
    for split in ("validation", "test"):
        assert (evaluated[split].iteration, evaluated[split].ppl, evaluated[split].loss) == \
               (ITERATIONS, training[split].ppl, training[split].loss)
    assert any(line.startswith(f" validation loss at iteration {ITERATIONS} on 16-sample draw from test set | lm loss "
                               f"value: {training['test'].loss:.6E} |") for line in log)


def test_skip_train_builds_no_optimizer_and_reads_no_optimizer_state(trained, tmp_path):
    """The checkpoint without its optimizer-state files evaluates as before; the engine has no optimizer."""
    weights_only = tmp_path / "checkpoint"
    shutil.copytree(trained.save, weights_only, symlinks=True)
    removed = [path.unlink() for path in weights_only.glob("global_step*/*optim_states.pt")]
    assert removed
    log, optimizer = run_on_ranks(evaluate_and_report_optimizer, 1, [*TRAINING, *trained.data, "--load",
                                                                     str(weights_only), "--skip-train"])[0]
    assert optimizer is None
    evaluated = {record.prefix: record.loss for record in parse_log(log).validations}
    assert evaluated == {record.prefix: record.loss for record in parse_log(trained.log).validations}


def evaluate_and_report_optimizer(argv):
    """--skip-train as pretrain() runs it, step by step: the lines it logs and the optimizer its engine holds."""
    from megatron.model.provider import model_provider
    from megatron.training.loop import build_trainer, evaluate_checkpoint

    trainer = build_trainer(model_provider, argv)
    return logged_lines(lambda: evaluate_checkpoint(trainer)), trainer.engine.optimizer


def generate_on_ranks(runs):
    from tools.generate_text import main
    return [main(argv) for argv in runs]


def hf_greedy(save):
    from transformers import GPT2Config, GPT2LMHeadModel
    checkpoint = read_checkpoint(save)
    config = gpt_config(checkpoint.model_config, checkpoint.padded_vocab_size)
    hf_model = GPT2LMHeadModel._from_config(GPT2Config(**hf_config(checkpoint.model_config, VOCAB + 1, torch.float32,
                                                                   {"bos_token_id": VOCAB, "eos_token_id": VOCAB})),
                                            attn_implementation="eager")
    weights = dict(to_hf_tensors(checkpoint.model, config, VOCAB + 1))
    missing, unexpected = hf_model.load_state_dict(weights, strict=False)
    assert (missing, unexpected) == (["lm_head.weight"], [])  # tied to the word embedding
    hf_model.tie_weights()
    outputs = []
    for prompt in PROMPTS:
        ids = torch.tensor([[int(token) for token in prompt.split()]])
        generated = hf_model.eval().generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                                             do_sample=False, eos_token_id=VOCAB, pad_token_id=VOCAB)
        outputs.append(generated[0, ids.shape[1]:].tolist())
    return outputs


def test_generation_at_tp1_and_tp2_dp2_equals_transformers_greedy_and_seeded_samples_agree(trained):
    common = ["--load", trained.save, "--prompt-file", trained.prompt_file, "--max-new-tokens", str(NEW_TOKENS),
              "--micro-batch-size", "2"]
    greedy_json = str(trained.directory / "greedy.jsonl")
    sampled = ["--top-k", "20", "--top-p", "0.9", "--temperature", "0.8", "--seed"]
    tp2 = ["--tensor-model-parallel-size", "2"]
    per_rank = run_on_ranks(generate_on_ranks, 4, [[*common, *tp2, "--greedy", "--output-json", greedy_json],
                                                   [*common, *tp2, *sampled, "3"]])
    (tp1_greedy, tp1_sampled), = run_on_ranks(generate_on_ranks, 1, [[*common, "--greedy", "--no-kv-cache"],
                                                                     [*common, *sampled, "3"]])
    tp2_greedy, tp2_sampled = per_rank[0]
    assert all(runs == per_rank[0] for runs in per_rank)  # every rank returns every prompt's result

    ids = lambda records: [record["generated_ids"] for record in records]
    expected = hf_greedy(trained.save)
    assert ids(tp2_greedy) == ids(tp1_greedy) == expected
    assert ids(tp2_sampled) == ids(tp1_sampled) != expected
    written = [json.loads(line) for line in open(greedy_json)]
    assert [record["prompt"] for record in written] == PROMPTS
    assert [(record["prompt_ids"], record["generated_ids"]) for record in written] == \
           [(record["prompt_ids"], record["generated_ids"]) for record in tp2_greedy]
    assert written[0]["text"] == " ".join(str(i) for i in written[0]["generated_ids"] if i != VOCAB)
    assert all(record["tokens_per_second"] > 0 for record in written)


def evaluate_on_ranks(runs):
    from tasks.zeroshot_gpt.evaluate import main
    return [main(argv) for argv in runs]


def test_zero_shot_tasks_at_tp2_equal_the_single_process_result(trained):
    tokenizer = NullTokenizer(VOCAB)
    model, _ = load_model(trained.save, tokenizer_vocab_size=tokenizer.vocab_size, parallel_state=None,
                          kernels=PORTABLE_KERNELS, dtype=torch.float32, device=torch.device("cpu"))
    wiki = trained.directory / "wiki.tokens"
    wiki.write_text(" ".join(str((3 * i) % VOCAB) for i in range(150)) + " \n")
    # Passages ending in the model's greedy next token (even ones) or in another token (odd ones).
    contexts = [[start + k * step for k in range(5)] for start, step in ((1, 1), (20, 2), (40, 3), (7, 1), (90, 2))]
    passages = []
    for number, context in enumerate(contexts):
        greedy, = generate_batch(model, [context], 1, SamplingParams(), [None], None, tokenizer.vocab_size)[0]
        passages.append(context + [greedy if number % 2 == 0 else (greedy + 1) % VOCAB])
    lambada = trained.directory / "lambada.jsonl"
    lambada.write_text("".join(json.dumps({"text": " ".join(map(str, passage))}) + "\n" for passage in passages))
    common = ["--load", trained.save, "--tensor-model-parallel-size", "2", "--micro-batch-size", "2"]
    wiki_result, lambada_result = run_on_ranks(evaluate_on_ranks, 2, [
        [*common, "--task", "WIKITEXT103", "--valid-data", str(wiki), "--seq-length", "32", "--overlapping-eval", "8"],
        [*common, "--task", "LAMBADA", "--valid-data", str(lambada)]])[0]

    expected_wiki = wikitext_perplexity(model, tokenizer, wiki.read_text(), seq_length=32, overlapping_eval=8,
                                        batch_size=4)
    assert (wiki_result.tokens, wiki_result.words) == (expected_wiki.tokens, expected_wiki.words) == (150, 150)
    assert wiki_result.summed_loss == pytest.approx(expected_wiki.summed_loss, rel=1e-5)
    assert (lambada_result.correct, lambada_result.total) == (3, 5)


@pytest.mark.parametrize("flags, message", [
    (["--vocab-size", "1000"], r"vocabulary mismatch: the model in .* was trained with a tokenizer of 201 tokens, "
                               r"but this tokenizer has 1001 tokens; use the tokenizer it was trained with "
                               r"\(--tokenizer-type NullTokenizer --vocab-size 200\)"),
    (["--vocab-size", "150"], r"trained with a tokenizer of 201 tokens, but this tokenizer has 151 tokens"),
    (["--prompt", " ".join(["5"] * 30), "--max-new-tokens", "3"],
     r"prompt 2 has 30 tokens; with --max-new-tokens 3 that is longer than the model's context of 32"),
    (["--pipeline-model-parallel-size", "2"], r"--pipeline-model-parallel-size 2: generation and evaluation run every "
                                              r"layer"),
    (["--iteration", "7"], r"has no checkpoint of iteration 7 .* it has: global_step30")])
def test_bad_input_with_a_checkpoint(trained, flags, message):
    from tools.generate_text import main
    with pytest.raises(InputError, match=message):
        main(["--load", trained.save, "--prompt", "1 2", *flags])


def test_skip_train_of_a_zero_0_checkpoint_reads_each_ranks_shard_of_the_weights(trained, tmp_path):
    """ZeRO 0 keeps the optimizer state inside the model-states files that DeepSpeed's load reads whole; the
    evaluation-only run reads each rank's weight shard instead (ResumePlan.foreign) and reports the losses the
    training run printed for the same checkpoint, here at TP 2."""
    save = str(tmp_path / "zero0")
    flags = [*TRAINING, *trained.data, "--zero-stage", "0", "--tensor-model-parallel-size", "2"]
    training_log = run_on_ranks(pretrain_and_log, 2, [*flags, "--save", save, "--save-interval", str(ITERATIONS)],
                                timeout=300)[1]
    plan = plan_load(job_config(validate_args(parse_args([*flags, "--load", save, "--skip-train"]), 2, "cpu")))
    assert plan.foreign and not plan.load_optimizer
    log = run_on_ranks(pretrain_and_log, 2, [*flags, "--load", save, "--skip-train"], timeout=300)[1]
    evaluated = {record.prefix: record.loss for record in parse_log(log).validations}
    assert sorted(evaluated) == ["test", "validation"]
    assert evaluated == {record.prefix: record.loss for record in parse_log(training_log).validations}
