"""tools/convert_checkpoint.py's command line: --hf-architecture only with --to-hf, one of the families' classes."""
import pytest

from megatron.errors import InputError
from tools.convert_checkpoint import parse_args


def test_hf_architecture_is_refused_without_to_hf_and_taken_with_it():
    with pytest.raises(InputError, match=r"^--hf-architecture MistralForCausalLM names the class --to-hf writes; "
                                         r"give --to-hf$"):
        parse_args(["--load", "ckpt", "--save", "out", "--hf-architecture", "MistralForCausalLM"])
    assert parse_args(["--load", "ckpt", "--to-hf", "out", "--hf-architecture", "MistralForCausalLM"]
                      ).hf_architecture == "MistralForCausalLM"
    with pytest.raises(SystemExit):  # argparse's choices: the families' classes only
        parse_args(["--load", "ckpt", "--to-hf", "out", "--hf-architecture", "Phi3ForCausalLM"])
