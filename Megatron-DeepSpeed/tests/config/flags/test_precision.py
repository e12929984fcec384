"""Mixed-precision flags (megatron/config/flags/precision.py): defaults, the refusals (both dtypes, fp16 on a CPU,
a loss scale DeepSpeed cannot take the log2 of) and the PrecisionConfig."""
import pytest

from megatron.config.flags import precision
from megatron.config.job import PrecisionConfig
from tests.helpers.flag_groups import parsed_alone, refusal, resolved


def test_defaults():
    assert parsed_alone(precision) == {"fp16": False, "bf16": False, "loss_scale": None,
                                       "initial_loss_scale": 2.0 ** 32, "min_loss_scale": 1.0,
                                       "loss_scale_window": 1000, "hysteresis": 2}


@pytest.mark.parametrize("changed, device, message", [
    ({"fp16": True, "bf16": True}, "cuda", "--fp16 and --bf16 were both given; choose one (or neither for fp32)"),
    ({"fp16": True}, "cpu", "--fp16 is not supported on device 'cpu'; use --bf16, or leave both --fp16 and --bf16 "
                            "off to train in fp32"),
    ({"initial_loss_scale": 1000.0}, "cuda", "--initial-loss-scale 1000.0 is not a power of two (DeepSpeed takes "
                                             "its log2); use e.g. 1024.0"),
])
def test_refusals(changed, device, message):
    assert refusal(precision.validate, {**resolved(), **changed}, device) == message


def test_fp16_passes_where_the_device_has_it():
    precision.validate({**resolved(), "fp16": True}, "cuda")


def test_section_and_its_dtype():
    section = precision.section(resolved("--bf16", "--hysteresis", "3"))
    assert section == PrecisionConfig(fp16=False, bf16=True, loss_scale=None, initial_loss_scale=2.0 ** 32,
                                      min_loss_scale=1.0, loss_scale_window=1000, hysteresis=3)
    assert section.name == "bf16"
