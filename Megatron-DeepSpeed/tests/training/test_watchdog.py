"""What a rank is waiting for (megatron/training/watchdog.py): heartbeat and deadline lengths, a collective that
gave up on a peer turned into one RunError naming the rank and the phase, other errors passed on, and heartbeat
lines while a phase lasts. The deadline that ends a hung process: test_run_failures.py."""
import logging
import time

import pytest

from megatron.errors import RunError
from megatron.training.watchdog import Watchdog, deadline_seconds, heartbeat_interval, is_peer_failure


def test_heartbeat_and_deadline_lengths():
    assert heartbeat_interval(10) == 60.0 and heartbeat_interval(1) == 15.0
    assert deadline_seconds(10) == 901.0


def test_which_errors_are_a_peer_that_failed():
    assert is_peer_failure(RuntimeError("[../gloo/transport/tcp/pair.cc:534] Connection closed by peer"))
    assert is_peer_failure(RuntimeError("Timed out waiting 600000ms for recv operation to complete"))
    assert not is_peer_failure(RuntimeError("shape mismatch"))
    assert not is_peer_failure(ValueError("timed out"))


@pytest.fixture
def watchdog():
    dog = Watchdog(rank=3, timeout_minutes=10, interval=0.2)
    yield dog
    dog.close()


def test_a_peer_failure_is_one_line_naming_the_rank_and_phase(watchdog):
    with pytest.raises(RunError) as error:
        with watchdog.phase("iteration 7"):
            raise RuntimeError("Connection closed by peer\n  more detail")
    assert str(error.value).startswith("rank 3: iteration 7 stopped after waiting 0 s for the other ranks "
                                       "(Connection closed by peer); another rank died or froze")
    assert str(error.value).endswith("--distributed-timeout-minutes is 10")


def test_other_errors_pass_unchanged(watchdog):
    with pytest.raises(RuntimeError, match="shape mismatch"):
        with watchdog.phase("iteration 7"):
            raise RuntimeError("shape mismatch")


def test_a_long_phase_logs_heartbeats(watchdog, caplog):
    caplog.set_level(logging.INFO, logger="megatron.training.watchdog")
    with watchdog.phase("evaluation"):
        for _ in range(200):
            if caplog.records:
                break
            time.sleep(0.05)
    assert caplog.records and caplog.records[0].getMessage().startswith("rank 3: still in evaluation after ")
