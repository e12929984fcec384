"""Pre-training's data source as the loop asks for it: --pack-sequences, which packs fine-tuning examples, is refused
in one line (pre-training samples are documents back to back already)."""
import pytest

from megatron.config.arguments import job_config, parse_args, validate_args
from megatron.data.data_loaders import PretrainingData
from megatron.errors import InputError


def test_pre_training_refuses_pack_sequences_in_one_line():
    argv = ["--num-layers", "2", "--hidden-size", "8", "--num-attention-heads", "2", "--seq-length", "16",
            "--micro-batch-size", "2", "--lr", "1e-3", "--train-iters", "2", "--mock-data", "--tokenizer-type",
            "NullTokenizer", "--vocab-size", "100"]
    assert PretrainingData().datasets(job_config(validate_args(parse_args(argv), 1, "cpu")), None, 128)[0] is not None
    packing = job_config(validate_args(parse_args(argv + ["--pack-sequences"]), 1, "cpu"))
    with pytest.raises(InputError, match=r"^--pack-sequences packs fine-tuning examples \(finetune_llama.py\)"):
        PretrainingData().datasets(packing, None, 128)
