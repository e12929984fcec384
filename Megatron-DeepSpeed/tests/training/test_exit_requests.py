"""Requests to end a run early (megatron/training/exit_requests.py): SIGTERM with --exit-signal-handler and
--exit-duration-in-mins each give the reason the run stops after this iteration; without them SIGTERM keeps its
meaning, and close() gives it back."""
import os
import signal
import time

import pytest

from megatron.training.exit_requests import ExitRequests
from tests.helpers.distributed import join_group_of_one


@pytest.fixture(autouse=True)
def group_of_one():
    join_group_of_one()


def test_sigterm_is_noted_then_given_back():
    before = signal.getsignal(signal.SIGTERM)
    requests = ExitRequests(on_sigterm=True, duration_minutes=None, started=time.monotonic())
    assert requests.reason() is None
    os.kill(os.getpid(), signal.SIGTERM)
    assert requests.reason() == "SIGTERM received (--exit-signal-handler)"
    requests.close()
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_duration_reached():
    requests = ExitRequests(on_sigterm=False, duration_minutes=0.5, started=time.monotonic() - 31)
    assert requests.reason() == "--exit-duration-in-mins 0.5 reached"
    assert ExitRequests(False, 0.5, started=time.monotonic()).reason() is None


def test_without_either_flag_nothing_is_asked_and_sigterm_is_untouched():
    before = signal.getsignal(signal.SIGTERM)
    requests = ExitRequests(on_sigterm=False, duration_minutes=None, started=0.0)
    assert requests.reason() is None and signal.getsignal(signal.SIGTERM) is before
    requests.close()
