"""Fixtures shared by the training tests."""
import pytest

from tests.helpers.distributed import run_on_ranks
from tests.helpers.training import COMMON, train, write_counting_dataset


@pytest.fixture(scope="module")
def data_prefix(tmp_path_factory):
    """A small learnable Megatron-format dataset (see tests/helpers/training.write_counting_dataset)."""
    return write_counting_dataset(str(tmp_path_factory.mktemp("data") / "counting_text_document"))


@pytest.fixture(scope="module")
def single_process(data_prefix):
    """The reference every parallel layout must equal: training on one process."""
    return run_on_ranks(train, 1, [*COMMON, "--data-path", data_prefix])[0]
