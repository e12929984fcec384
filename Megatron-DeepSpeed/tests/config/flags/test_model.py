"""--window-size as Megatron-LM spells it (LEFT,RIGHT; megatron/training/arguments.py's tuple of two ints) read into
the model's window_size; what a causal model cannot mean is one line. The flag reaching the built model:
tests/config/test_model_config.py."""
import pytest

from megatron.config.flags.model import window_size
from megatron.errors import InputError


def test_left_right_and_left_alone():
    assert (window_size("4095,0"), window_size("7"), window_size("0,0")) == (4095, 7, 0)
    assert window_size("-1,0") is None and window_size(None) is None  # Megatron-LM's -1: no limit


@pytest.mark.parametrize("flag, message", [
    ("4095,1", "only causal windows are supported"), ("-2,0", "only causal windows are supported"),
    ("4k", "is not LEFT,RIGHT"), ("1,0,0", "is not LEFT,RIGHT")])
def test_what_a_causal_model_cannot_mean_is_one_line(flag, message):
    with pytest.raises(InputError, match=f"^--window-size .*{message}") as caught:
        window_size(flag)
    assert "\n" not in str(caught.value)
