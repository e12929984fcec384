"""The training package (megatron/training/__init__.py): `from megatron.training import pretrain` works as in
upstream Megatron, yet importing a light module of the package does not import DeepSpeed."""
import subprocess
import sys

import pytest

import megatron.training
from tests.helpers.paths import PACKAGE_ROOT


def test_pretrain_is_the_loops():
    from megatron.training import pretrain
    from megatron.training.loop import pretrain as loop_pretrain
    assert pretrain is loop_pretrain


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="module 'megatron.training' has no attribute 'pretrian'"):
        megatron.training.pretrian


def test_a_light_module_does_not_import_deepspeed():
    check = "import sys, megatron.training.log_lines; print('deepspeed' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", check], cwd=PACKAGE_ROOT, capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "False"
