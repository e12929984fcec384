"""One flag group of megatron/config/flags/ at a time: its flags parsed on their own (its defaults), the values
every group sees when it checks (a small valid command line parsed and resolved, changed where a test says), and
a refusal read as the one line the user gets."""
import pytest

from megatron.config.arguments import parse_args, resolve
from megatron.config.flags.common import OneLineErrorParser
from megatron.errors import InputError

# A small valid training command line: synthetic data, a tokenizer without files.
VALID = ["--num-layers", "2", "--hidden-size", "8", "--num-attention-heads", "2", "--seq-length", "16",
         "--micro-batch-size", "2", "--lr", "1e-3", "--train-iters", "10", "--tokenizer-type", "NullTokenizer",
         "--vocab-size", "100", "--mock-data"]


def parsed_alone(group, *argv, **options) -> dict:
    """The values of `group`'s flags alone (its add_flags(parser, **options)) for the command line argv."""
    parser = OneLineErrorParser(prog="group")
    group.add_flags(parser, **options)
    return vars(parser.parse_args(list(argv)))


def resolved(*argv, world_size: int = 1, device: str = "cpu") -> dict:
    """The values of VALID plus argv, parsed and resolved by every group: what a group's check and section see."""
    return resolve(vars(parse_args([*VALID, *argv])), world_size, device)


def refusal(check, *arguments) -> str:
    """The message of the InputError check(*arguments) raises; asserted to be one line."""
    with pytest.raises(InputError) as error:
        check(*arguments)
    message = str(error.value)
    assert "\n" not in message
    return message
