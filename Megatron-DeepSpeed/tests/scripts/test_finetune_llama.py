"""finetune_llama.py with upstream main's finetune_llama.sh flag set (sizes shrunk): a Llama imported from Hugging
Face fine-tunes on upstream's Alpaca JSON at one process and at TP 2 x PP 2 with the same losses, the first of
them transformers' loss on the same examples with prompts and padding left out; chat rows train on the assistant
turns alone, the same way, from the files tools/preprocess_sft_data.py writes."""
import os

import numpy as np
import pytest
import torch

from megatron.checkpoint.convert.conversions import import_hf
from megatron.checkpoint.convert.target_writer import TargetLayout
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
