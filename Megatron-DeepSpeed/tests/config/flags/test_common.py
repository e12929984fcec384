"""What every flag group shares (megatron/config/flags/common.py): the flag's spelling, the required and range
rules in one wording, the one-line parser, bounded numbers and sections built from same-named values."""
import argparse
from dataclasses import dataclass

import pytest

from megatron.config.flags.common import (Limits, OneLineErrorParser, check_ranges, check_required, describe, flag,
                                          given, number_above, same_named)
from tests.helpers.flag_groups import refusal


def test_spelling_and_description():
    assert flag("tensor_model_parallel_size") == "--tensor-model-parallel-size"
    assert describe({"train_iters": 5, "lr": 0.1}, ["train_iters", "lr"]) == "--train-iters 5 and --lr 0.1"
    assert given({"a": 0, "b": None, "c": 3}, "a", "b", "c") == ["c"]  # 0 counts as unset


def test_a_required_flag_names_the_presets_that_could_give_it():
    assert refusal(check_required, {"num_layers": None}, Limits(required=("num_layers",)), ["gpt2", "llama2-7b"]) == (
        "--num-layers is required: give it, or --model-size NAME (one of gpt2, llama2-7b) to take it from a preset")


@pytest.mark.parametrize("field, value, wanted", [("positive", 0, "greater than 0"),
                                                  ("non_negative", -1, "0 or more"),
                                                  ("fractions", 1.0, "in [0, 1)")])
def test_each_range_rule_in_one_wording(field, value, wanted):
    assert refusal(check_ranges, {"x_y": value}, [Limits(**{field: ("x_y",)})]) == (
        f"--x-y {value} is out of range: it must be {wanted}")


def test_ranges_accept_values_inside_and_flags_not_given():
    check_ranges({"a": 1, "b": 0, "c": 0.5, "d": None},
                 [Limits(positive=("a", "d"), non_negative=("b",), fractions=("c",))])


def test_positive_rules_of_every_group_come_before_the_non_negative_ones():
    values = {"first": -1, "second": 0}
    assert refusal(check_ranges, values, [Limits(non_negative=("first",)), Limits(positive=("second",))]).startswith(
        "--second 0")


def test_a_malformed_command_line_is_one_line_naming_the_program():
    parser = OneLineErrorParser(prog="pretrain_gpt.py")
    parser.add_argument("--count", type=number_above(0, int))
    assert parser.parse_args(["--count", "3"]).count == 3
    assert refusal(parser.parse_args, ["--count", "0"]) == (
        "argument --count: 0 must be greater than 0 (see pretrain_gpt.py --help)")
    assert "unrecognized arguments: --cuont" in refusal(parser.parse_args, ["--cuont", "1"])


def test_a_section_takes_the_same_named_values_and_the_renamed_ones():
    @dataclass
    class Section:
        lr: float
        style: str

    assert same_named(Section, {"lr": 0.1, "lr_decay_style": "cosine", "other": 1}, style="cosine") == Section(
        0.1, "cosine")
    with pytest.raises(argparse.ArgumentTypeError):
        number_above(1.0, float)("1.0")
