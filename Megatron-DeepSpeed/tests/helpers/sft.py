"""Shared by the fine-tuning tests: a tiny Hugging Face Llama with a chat template, built here (never downloaded),
rows of each format, and upstream main's finetune_llama.sh flag set at CPU sizes."""
import json
import os

from megatron.data.sft_demo import CHAT_TEMPLATE
from tests.families.llama.test_hf_adapter import llama, write_tokenizer

SHAPE = dict(num_key_value_heads=4, rope_theta=10000.0, rms_norm_eps=1e-5, max_position_embeddings=192)
SEQ = 192

ALPACA_ROWS = [
    {"instruction": "the quick brown fox", "input": "", "output": "jumps over the lazy dog"},
    {"instruction": "a llama eats", "input": "in the high mountains", "output": "grass"},
    {"instruction": "the dog and", "input": "", "output": "the llama are friends"},
    {"instruction": "mountains are", "input": "", "output": "high and cold"},
] * 2
CHAT_ROWS = [
    {"messages": [{"role": "user", "content": "a llama eats"}, {"role": "assistant", "content": "grass"},
                  {"role": "user", "content": "the dog"}, {"role": "assistant", "content": "and the llama"}]},
    {"conversations": [{"from": "system", "value": "quick"}, {"from": "human", "value": "mountains are"},
                       {"from": "gpt", "value": "high and cold"}]},
] * 4


def write_chat_llama(directory: str) -> str:
    """A seeded transformers Llama (MHA, Llama 2's rotary base and epsilon) and its tokenizer with CHAT_TEMPLATE."""
    vocab_size = write_tokenizer(directory)
    path = os.path.join(directory, "tokenizer_config.json")
    with open(path) as handle:
        config = json.load(handle)
    config.update(eos_token="</s>", chat_template=CHAT_TEMPLATE)  # transformers 5 reads string special tokens
    with open(path, "w") as handle:
        json.dump(config, handle)
    llama(vocab_size, **SHAPE).save_pretrained(directory)
    return directory


def write_rows(path: str, rows: list, as_list: bool = False) -> str:
    """A JSON list (upstream's Alpaca file) or JSONL."""
    with open(path, "w") as handle:
        if as_list:
            json.dump(rows, handle)
        else:
            handle.writelines(json.dumps(row) + "\n" for row in rows)
    return path


def upstream_finetune_flags(load: str, data: str, tokenizer: str, out: str, tp: int = 1, pp: int = 1,
                            iters: int = 2) -> list:
    """examples_deepspeed/finetune_hf_llama/finetune_llama.sh's command (upstream main 4efb479), its flags in its
    order, sizes shrunk to the tiny Llama; --bf16 dropped (fp32, so that losses compare with transformers' to 1e-5)
    with the bf16 section of the DeepSpeed JSON it writes, and nccl replaced by gloo."""
    ds_config = os.path.join(out, "ds_config.json")
    with open(ds_config, "w") as handle:
        json.dump({"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2, "steps_per_print": 100,
                   "zero_optimization": {"stage": 0}}, handle)
    return ["--load", load,
            "--tensor-model-parallel-size", str(tp), "--pipeline-model-parallel-size", str(pp),
            "--lr-warmup-iters", "2", "--weight-decay", "0.1", "--clip-grad", "1", "--num-layers", "2",
            "--hidden-size", "32", "--num-attention-heads", "4", "--finetune", "--ffn-hidden-size", "48",
            "--attention-dropout", "0", "--hidden-dropout", "0", "--no-query-key-layer-scaling",
            "--disable-bias-linear", "--normalization", "rmsnorm", "--use-rotary-position-embeddings",
            "--untie-embeddings-and-output-weights", "--swiglu", "--seq-length", str(SEQ),
            "--max-position-embeddings", str(SEQ), "--micro-batch-size", "2", "--global-batch-size", "4",
            "--train-iters", str(iters), "--lr", "2e-5", "--tensorboard-dir", os.path.join(out, "tensorboard"), "--lr-decay-iters", "320", "--lr-decay-style", "cosine",
            "--log-interval", "1", "--eval-iters", "100", "--eval-interval", "100", "--data-path", data,
            "--save-interval", "1500", "--split", "100,0,0", "--zero-stage", "0", "--tokenizer-type", "HFTokenizer",
            "--tokenizer-model", tokenizer, "--deepspeed_config", ds_config, "--deepspeed",
            "--distributed-backend", "gloo", "--num-workers", "0", "--no-masked-softmax-fusion",
            "--no-bias-gelu-fusion", "--no-bias-dropout-fusion", "--no-gradient-accumulation-fusion",
            "--repeated-dataloader"]
