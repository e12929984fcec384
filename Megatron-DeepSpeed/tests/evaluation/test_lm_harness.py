"""lm-evaluation-harness on our checkpoints (megatron/evaluation/lm_harness.py): a TP 2 x PP 2 checkpoint, joined
into one process while it loads, scores lm-eval's three request types on local tasks (tests/fixtures/lm_eval:
YAML over a JSONL, no download) as the same model exported to Hugging Face scores them through lm-eval's own
`hf` model. The model is a seeded random GPT-2 with a byte-level BPE tokenizer trained on the fixture's text,
imported at TP 2 x PP 2 by the converter (megatron/hf), then exported."""
import json
import os
import sys

import pytest
import torch

from megatron.hf.conversions import export_hf, import_hf
from megatron.checkpoint.reshape.target_writer import TargetLayout
from megatron.errors import InputError, run_cli
from tests.helpers.paths import PACKAGE_ROOT

FIXTURES = os.path.join(PACKAGE_ROOT, "tests", "fixtures", "lm_eval")
TASKS = ["tiny_choice", "tiny_rolling", "tiny_generate"]
OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def write_hf_model(directory: str) -> None:
    """A random GPT2LMHeadModel (64 positions) and its tokenizer.json: byte-level BPE of 300 tokens, trained on
    the fixture's text, <|endoftext|> its end of document."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel

    os.makedirs(directory)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    with open(os.path.join(FIXTURES, "tiny_qa.jsonl"), encoding="utf-8") as handle:
        texts = handle.read().splitlines()
    tokenizer.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer.save(os.path.join(directory, "tokenizer.json"))
    with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as handle:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|endoftext|>",
                   "eos_token": "<|endoftext|>"}, handle)
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=tokenizer.get_vocab_size(), n_positions=64, n_embd=32, n_layer=2, n_head=4,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    GPT2LMHeadModel(config).eval().save_pretrained(directory)


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    """lm_eval with every Hugging Face library offline, its caches in a temporary directory and the working
    directory the fixtures' (their data_files are relative), and the TP 2 x PP 2 checkpoint with its export."""
    root = tmp_path_factory.mktemp("lm_eval")
    with pytest.MonkeyPatch.context() as patch:
        for name, value in {**OFFLINE, "HF_HOME": str(root / "hf-home"),
                            "HF_DATASETS_CACHE": str(root / "datasets")}.items():
            patch.setenv(name, value)
        patch.chdir(FIXTURES)
        import datasets
        import lm_eval
        from lm_eval.tasks import TaskManager

        from megatron.evaluation import lm_harness  # noqa: F401  registers megatron_gpt
        assert datasets.config.HF_DATASETS_OFFLINE and datasets.config.HF_HUB_OFFLINE  # read at its import
        write_hf_model(str(root / "hf"))
        checkpoint, exported = str(root / "tp2pp2"), str(root / "exported")
        import_hf(str(root / "hf"), checkpoint, TargetLayout(2, 2), make_vocab_size_divisible_by=32)
        export_hf(checkpoint, exported)
        yield lm_eval, TaskManager(include_path=FIXTURES), checkpoint, exported


def evaluate(harness, model: str, model_args: str, **options):
    lm_eval, tasks, *_ = harness
    return lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=TASKS, task_manager=tasks,
                                   batch_size=3, log_samples=True, **options)


@pytest.fixture(scope="module")
def scores(harness):
    """(ours, lm-eval's hf model's on the export): simple_evaluate's results with every request's answer."""
    _, _, checkpoint, exported = harness
    return (evaluate(harness, "megatron_gpt", f"load={checkpoint}"),
            evaluate(harness, "hf", f"pretrained={exported},dtype=float32", device="cpu"))


def test_a_tp2_pp2_checkpoint_scores_as_its_hf_export(scores):
    ours, theirs = scores
    for task in TASKS:
        mine, reference = ours["samples"][task], theirs["samples"][task]
        assert len(mine) == len(reference) == 8
        for sample, expected in zip(mine, reference):
            assert sample["arguments"] == expected["arguments"]
            for answer, oracle in zip(sample["resps"], expected["resps"]):
                answer, oracle = answer[0], oracle[0]
                if task == "tiny_choice":  # (log-likelihood, greedy)
                    assert answer[0] == pytest.approx(oracle[0], abs=1e-5) and answer[1] == oracle[1]
                elif task == "tiny_rolling":
                    assert answer == pytest.approx(oracle, abs=1e-5)
                else:
                    assert answer == oracle and len(answer) > 0
        for metric, value in theirs["results"][task].items():
            if isinstance(value, float):
                assert ours["results"][task][metric] == pytest.approx(value, rel=1e-6), (task, metric)


def test_requests_come_back_in_their_order_whatever_the_batch(harness, scores):
    lm_eval, tasks, checkpoint, _ = harness
    one = lm_eval.simple_evaluate(model="megatron_gpt", model_args=f"load={checkpoint}", tasks=["tiny_choice"],
                                  task_manager=tasks, batch_size=1, log_samples=True)
    for sample, batched in zip(one["samples"]["tiny_choice"], scores[0]["samples"]["tiny_choice"]):
        assert [answer[0][0] for answer in sample["resps"]] == pytest.approx(
            [answer[0][0] for answer in batched["resps"]], abs=1e-5)


def test_bad_model_args_are_one_line(harness):
    from megatron.evaluation.lm_harness import MegatronGPT

    _, _, checkpoint, _ = harness
    with pytest.raises(InputError, match=r"--model megatron_gpt needs --model_args load=DIR"):
        MegatronGPT()
    with pytest.raises(InputError, match=r"--model_args pretrained: not an argument of megatron_gpt"):
        MegatronGPT(load=checkpoint, pretrained="gpt2")
    with pytest.raises(InputError, match=r"--model_args dtype=float64: choose one of float32, bfloat16, float16"):
        MegatronGPT(load=checkpoint, dtype="float64")
    with pytest.raises(InputError, match=r"--model_args batch_size=auto: give a whole number of 1 or more"):
        MegatronGPT(load=checkpoint, batch_size="auto")
    with pytest.raises(InputError, match=r"--model_args iteration=last: give a whole number of 0 or more"):
        MegatronGPT(load=checkpoint, iteration="last")


@pytest.mark.full
def test_the_tool_is_lm_evals_command_line_with_our_model(harness, scores, tmp_path, monkeypatch, capsys):
    """tools/evaluate_harness.py's main as its script runs it (run_cli), in this process: lm-eval is loaded
    already, and a process of its own would spend most of its time importing it again."""
    from tools.evaluate_harness import main

    _, _, checkpoint, _ = harness
    monkeypatch.setattr(sys, "argv", ["evaluate_harness.py"])  # main hands lm_eval its command line there
    tool = ["--model", "megatron_gpt", "--tasks", "tiny_choice", "--include_path", FIXTURES]
    run_cli(main, [*tool, "--model_args", f"load={checkpoint}", "--batch_size", "4", "--output_path", str(tmp_path)])
    written, = [os.path.join(folder, name) for folder, _, names in os.walk(tmp_path) for name in names
                if name.startswith("results") and name.endswith(".json")]
    with open(written, encoding="utf-8") as handle:
        from_tool = json.load(handle)["results"]["tiny_choice"]
    reference = scores[0]["results"]["tiny_choice"]
    assert from_tool["acc,none"] == reference["acc,none"] and from_tool["acc_norm,none"] == reference["acc_norm,none"]
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        run_cli(main, [*tool, "--model_args", f"load={checkpoint},dtype=float64"])
    assert exit_info.value.code == 2 and capsys.readouterr().err.strip().splitlines()[-1] == \
        "error: --model_args dtype=float64: choose one of float32, bfloat16, float16"
