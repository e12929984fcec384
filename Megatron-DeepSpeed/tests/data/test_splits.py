"""Megatron's --split rule (megatron/data/splits.py): the items each split gets, with its rounding (ties to even)
and the final shift, and each malformed --split as one line naming it and the fix."""
import pytest

from megatron.data.splits import parse_split, split_boundaries
from megatron.errors import InputError


@pytest.mark.parametrize("splits, items, expected", [
    ("8,1,1", 10, [0, 8, 9, 10]),
    ("98/1/1", 1000, [0, 980, 990, 1000]),
    ("949,50,1", 1000, [0, 949, 999, 1000]),
    ("100,0,0", 7, [0, 7, 7, 7]),
    ("100", 7, [0, 7, 7, 7]),              # missing parts are 0
    ("1,1", 5, [0, 3, 5, 5]),              # 2.5 rounds to 2 twice (ties to even): shifted by 1
    ("1,1,1", 5, [0, 1, 3, 5]),            # 5/3 rounds to 2 thrice: every boundary moves back 1
    ("1,1,1", 0, [0, 0, 0, 0]),
])
def test_split_boundaries_hand_computed(splits, items, expected):
    assert split_boundaries(splits, items) == expected


def test_parse_split_normalises():
    assert parse_split("3,1") == [0.75, 0.25, 0.0]


@pytest.mark.parametrize("splits, fragment", [
    ("a,b", "'a' is not a number"),
    ("1,2,3,4", "4 parts"),
    ("-1,2", "'-1' must be a finite number >= 0"),
    ("0,0,0", "share of 0"),
    ("1,,1", "'' is not a number"),
    ("nan", "finite"),
])
def test_bad_split_string_says_what_and_how(splits, fragment):
    with pytest.raises(InputError, match="--split") as error:
        parse_split(splits)
    assert fragment in str(error.value)
    assert "949,50,1" in str(error.value)
