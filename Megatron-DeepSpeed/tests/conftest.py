"""Fixtures shared by the training tests, and the --cpu-isa option (tests/helpers/cpu_isa.py)."""
import pytest

from tests.helpers import cpu_isa
from tests.helpers.distributed import run_on_ranks
from tests.helpers.entry_scripts import one_node_full_run
from tests.helpers.training import COMMON, train, write_counting_dataset


def pytest_addoption(parser):
    parser.addoption("--cpu-isa", choices=sorted(cpu_isa.CAPS), default="default",
                     help="cap the CPU kernels of the tests and their processes (avx2: as on a CPU without AVX512, "
                          "whose bf16 sums round differently)")


def pytest_configure(config):
    config.cpu_capability = cpu_isa.force(config.getoption("--cpu-isa"))


def pytest_report_header(config):
    return f"cpu kernels: {config.cpu_capability} (--cpu-isa {config.getoption('--cpu-isa')})"


@pytest.fixture(scope="module")
def data_prefix(tmp_path_factory):
    """A small learnable Megatron-format dataset (see tests/helpers/training.write_counting_dataset)."""
    return write_counting_dataset(str(tmp_path_factory.mktemp("data") / "counting_text_document"))


@pytest.fixture(scope="module")
def single_process(data_prefix):
    """The reference every parallel layout must equal: training on one process."""
    return run_on_ranks(train, 1, [*COMMON, "--data-path", data_prefix])[0]


@pytest.fixture(scope="session")
def shared_full_run(tmp_path_factory):
    """(run directory, output) of the one run of test/train_full_8p.sh that the entry-script, multi-node and
    exit-status tests read (tests/helpers/entry_scripts.py)."""
    run_dir = tmp_path_factory.mktemp("shared_full_run")
    return run_dir, one_node_full_run(str(run_dir))


@pytest.fixture(autouse=True)
def process_left_as_found():
    """Each test leaves the test process as it found it, whatever order the tests run in: a test that runs
    pretrain_gpt.py's main in this process joins a process group of one (which sets RANK and MASTER_PORT) and may
    install signal handlers; the processes later tests start would otherwise inherit those variables and that
    port, or an ignored Ctrl-C."""
    import os
    import signal

    import torch.distributed as dist

    environment = dict(os.environ)
    handlers = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    yield
    if dist.is_initialized():
        dist.destroy_process_group()
    os.environ.clear()
    os.environ.update(environment)
    for number, handler in handlers.items():
        if signal.getsignal(number) is not handler:
            signal.signal(number, handler)
