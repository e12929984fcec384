"""Which items of an indexed dataset go to train, valid and test (Megatron's --split rule).

The rule splits ITEMS, not documents, and its rounding is part of the data order: a user who
moves from Megatron must get the same items in each split, so Python's round() (ties to even) and
the final shift of every boundary are kept exactly.
"""
from megatron.errors import InputError

SPLIT_NAMES = ("train", "valid", "test")

_EXAMPLE = "write three proportions like '949,50,1' or '98/1/1' (missing parts count as 0)"


def parse_split(splits_string: str) -> list[float]:
    """The three proportions of `--split`, normalised to sum to 1."""
    text = str(splits_string)
    separator = "," if "," in text else "/"
    parts = text.split(separator)
    if len(parts) > len(SPLIT_NAMES):
        raise InputError(f"--split {text!r} has {len(parts)} parts but only train, valid and "
                         f"test exist; {_EXAMPLE}")
    proportions = []
    for part in parts:
        try:
            value = float(part)
        except ValueError:
            raise InputError(f"--split {text!r}: {part.strip()!r} is not a number; "
                             f"{_EXAMPLE}") from None
        if not 0 <= value < float("inf"):
            raise InputError(f"--split {text!r}: {part.strip()!r} must be a finite number >= 0; "
                             f"{_EXAMPLE}")
        proportions.append(value)
    proportions += [0.0] * (len(SPLIT_NAMES) - len(proportions))
    total = sum(proportions)
    if total <= 0:
        raise InputError(f"--split {text!r} gives every split a share of 0; {_EXAMPLE}")
    return [value / total for value in proportions]


def split_boundaries(splits_string: str, num_items: int) -> list[int]:
    """[0, end of train, end of valid, num_items]: split k holds items [b[k], b[k + 1])."""
    boundaries = [0]
    for proportion in parse_split(splits_string):
        boundaries.append(boundaries[-1] + int(round(proportion * float(num_items))))
    excess = boundaries[-1] - num_items
    return [boundaries[0]] + [boundary - excess for boundary in boundaries[1:]]
