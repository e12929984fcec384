"""finetune_llama.py with upstream main's finetune_llama.sh flag set (sizes shrunk): a Llama imported from Hugging
Face fine-tunes on upstream's Alpaca JSON at one process and at TP 2 x PP 2 with the same losses, the first of
them transformers' loss on the same examples with prompts and padding left out; chat rows train on the assistant
turns alone, the same way, from the files tools/preprocess_sft_data.py writes; a run resumed mid-epoch continues
exactly; the entry script's tool takes a Hugging Face model in and out (the export generates as our generator)."""

import numpy as np
import pytest
import torch

from megatron.hf.conversions import import_hf
from megatron.checkpoint.reshape.target_writer import TargetLayout
from megatron.data.sft_data import pad_id, renderer_for
from megatron.data.sft_dataset import collect, iter_rows, padded_sample, read_examples
from megatron.tokenizer import build_tokenizer
from tests.helpers.distributed import run_on_ranks
from tests.helpers.sft import ALPACA_ROWS, CHAT_ROWS, SEQ, upstream_finetune_flags, write_chat_llama, write_rows


@pytest.fixture(scope="module")
def hf_llama(tmp_path_factory):
    return write_chat_llama(str(tmp_path_factory.mktemp("hf") / "llama"))


def imported(hf_llama, directory, tp: int, pp: int) -> str:
    """The import, its 100-entry vocabulary unpadded (padded rows would join the softmax, unlike transformers')."""
    import_hf(hf_llama, str(directory), TargetLayout(tp, pp), make_vocab_size_divisible_by=50)
    return str(directory)


def finetune_on_rank(argv):
    import torch.distributed as dist
    from finetune_llama import main
    result = main(argv)
    return result.losses if dist.get_rank() == 0 else None


def transformers_first_loss(hf_llama, data: str, micro_batches: int = 2, micro_batch_size: int = 2) -> float:
    """transformers' mean loss of each of the first micro-batches (the examples in file order, padded), targets only
    where the example's mask says (prompts, padding: -100), averaged as the trainer averages micro-batches."""
    from transformers import LlamaForCausalLM

    tokenizer = build_tokenizer("HFTokenizer", tokenizer_model=hf_llama)
    examples, _ = collect(read_examples(iter_rows(data), renderer_for(tokenizer), SEQ, say=lambda line: None))
    model = LlamaForCausalLM.from_pretrained(hf_llama).eval()
    losses = []
    for first in range(0, micro_batches * micro_batch_size, micro_batch_size):
        samples = [padded_sample([example], SEQ + 1, pad_id(tokenizer)) for example in
                   examples[first:first + micro_batch_size]]
        ids = torch.from_numpy(np.stack([sample["text"] for sample in samples]))
        mask = torch.from_numpy(np.stack([sample["loss_mask"] for sample in samples])).bool()
        with torch.no_grad():
            losses.append(model(ids, labels=torch.where(mask, ids, -100)).loss.item())
    return sum(losses) / len(losses)


@pytest.mark.full
def test_upstream_flag_set_trains_an_import_at_one_process_and_tp2_pp2_from_transformers_loss(hf_llama, tmp_path):
    data = write_rows(str(tmp_path / "alpaca_data.json"), ALPACA_ROWS, as_list=True)
    losses = {}
    for tp, pp in ((1, 1), (2, 2)):
        out = tmp_path / f"tp{tp}pp{pp}"
        out.mkdir()
        argv = upstream_finetune_flags(imported(hf_llama, out / "imported", tp, pp), data, hf_llama, str(out), tp, pp)
        losses[tp, pp] = run_on_ranks(finetune_on_rank, tp * pp, argv)[0]
    assert len(losses[1, 1]) == 2 and losses[2, 2] == pytest.approx(losses[1, 1], rel=1e-5)
    assert losses[1, 1][0] == pytest.approx(transformers_first_loss(hf_llama, data), rel=1e-5)


@pytest.mark.full
def test_preprocessed_chat_rows_train_on_the_assistant_turns_from_transformers_loss(hf_llama, tmp_path):
    from tools.preprocess_sft_data import main as preprocess

    data = write_rows(str(tmp_path / "chat.jsonl"), CHAT_ROWS)
    preprocess(["--input", data, "--output-prefix", str(tmp_path / "chat"), "--tokenizer-type", "HFTokenizer",
                "--tokenizer-model", hf_llama, "--seq-length", str(SEQ)])
    argv = upstream_finetune_flags(imported(hf_llama, tmp_path / "imported", 1, 1), str(tmp_path / "chat"), hf_llama,
                                   str(tmp_path), iters=1)
    losses = run_on_ranks(finetune_on_rank, 1, argv)[0]
    assert losses[0] == pytest.approx(transformers_first_loss(hf_llama, data), rel=1e-5)


def generate_on_rank(argv):
    from tools.generate_text import main
    return main(argv)


@pytest.mark.full
def test_the_entry_script_tool_exports_a_model_that_generates_as_our_generator(hf_llama, tmp_path, capfd):
    """tools/launch_finetune.py (test/finetune_llama_8p.sh): HF in, fine-tuned at PP 2 on 2 CPU processes, summary
    and loss curve, HF out; the export's greedy tokens in transformers are our generator's on the checkpoint."""
    from transformers import LlamaForCausalLM
    from tools.launch_finetune import main

    run = tmp_path / "run"
    main(["--hf_model", hf_llama, "--data_path", write_rows(str(tmp_path / "rows.json"), ALPACA_ROWS, as_list=True),
          "--tp", "1", "--pp", "2", "--nproc", "2", "--train_iters", "2", "--seq_length", str(SEQ),
          "--global_batch_size", "4", "--device", "cpu", "--output_dir", str(run), "--lr", "1e-2"])
    out = capfd.readouterr().out
    assert "Final Train lm loss PPL(accuracy): " in out and f"Fine-tuned model (Hugging Face): {run / 'hf'}" in out
    assert (run / "loss_curve.png").stat().st_size > 0
    (tmp_path / "prompts.txt").write_text("the quick brown\n")
    record = run_on_ranks(generate_on_rank, 1, ["--load", str(run / "checkpoints"), "--prompt-file",
                                                str(tmp_path / "prompts.txt"), "--max-new-tokens", "8", "--greedy",
                                                "--micro-batch-size", "1"])[0][0]
    ids = torch.tensor([record["prompt_ids"]])
    expected = LlamaForCausalLM.from_pretrained(run / "hf").eval().generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False, eos_token_id=2,
        pad_token_id=2)[0, ids.shape[1]:].tolist()
    assert record["generated_ids"] == expected[:len(record["generated_ids"])] and \
        (record["generated_ids"] == expected or record["generated_ids"][-1] == 2)


def with_flag(argv: list, flag: str, value=None) -> list:
    """argv with `flag`'s value replaced (or the switch removed when value is None)."""
    index = argv.index(flag)
    return argv[:index] + argv[index + 1:] if value is None else argv[:index + 1] + [value] + argv[index + 2:]


@pytest.mark.full
def test_a_run_resumed_mid_epoch_continues_as_the_uninterrupted_one(hf_llama, tmp_path):
    """8 examples, 4 a step: saved after iteration 1 (half an epoch), resumed to iteration 3, the losses of
    iterations 2 and 3 are the uninterrupted run's."""
    data = write_rows(str(tmp_path / "alpaca_data.json"), ALPACA_ROWS, as_list=True)
    base = upstream_finetune_flags(imported(hf_llama, tmp_path / "imported", 1, 1), data, hf_llama, str(tmp_path),
                                   iters=3)
    whole = run_on_ranks(finetune_on_rank, 1, base)[0]
    first = with_flag(with_flag(base, "--train-iters", "1"), "--save-interval", "1") + ["--save", str(tmp_path / "a")]
    run_on_ranks(finetune_on_rank, 1, first)
    resumed = run_on_ranks(finetune_on_rank, 1, with_flag(with_flag(base, "--finetune"), "--load", str(tmp_path / "a")))[0]
    assert len(whole) == 3 and resumed == pytest.approx(whole[1:], rel=1e-6)
