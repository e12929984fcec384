"""HCCL's timeouts follow --distributed-timeout-minutes: HCCL gives up first (so it reports the hang, as torch_npu
asks), within CANN's connect-timeout range, and a user's HCCL_EXEC_TIMEOUT that would outlast torch's is refused."""
import pytest

from megatron.errors import InputError
from megatron.parallel_state import hccl_environment, hccl_timeouts
from tools.launch_training import DEFAULT_TIMEOUT_MINUTES


@pytest.mark.parametrize("minutes, exec_timeout, connect_timeout", [
    (10, 540, 540),  # Megatron's default
    (DEFAULT_TIMEOUT_MINUTES, 3240, 3240),  # the launcher's: ranks wait while rank 0 builds the index cache
    (1, 54, 120),  # CANN's connect timeout is at least 120 s
    (240, 12960, 7200),  # ... and at most 7200 s
])
def test_hccl_timeouts_from_the_flag(minutes, exec_timeout, connect_timeout):
    assert hccl_timeouts(minutes) == {"HCCL_EXEC_TIMEOUT": str(exec_timeout),
                                      "HCCL_CONNECT_TIMEOUT": str(connect_timeout)}


@pytest.mark.parametrize("minutes", [0.5, 10, 60, 1000])
def test_hccl_always_gives_up_before_torchs_watchdog(minutes):
    assert 0 < int(hccl_timeouts(minutes)["HCCL_EXEC_TIMEOUT"]) < minutes * 60


def test_values_the_user_set_are_kept_when_they_agree():
    user = {"HCCL_EXEC_TIMEOUT": "300", "HCCL_CONNECT_TIMEOUT": "600"}
    assert hccl_environment(10, user) == {}
    assert hccl_environment(10, {"HCCL_CONNECT_TIMEOUT": "600"}) == {"HCCL_EXEC_TIMEOUT": "540"}


@pytest.mark.parametrize("value", ["3600", "600", "0", "-1", "soon"])
def test_an_exec_timeout_torch_would_cut_short_is_refused_in_one_line(value):
    with pytest.raises(InputError, match=rf"HCCL_EXEC_TIMEOUT='{value}' .* --distributed-timeout-minutes 10 "
                                         r"\(600 s\).*unset HCCL_EXEC_TIMEOUT"):
        hccl_environment(10, {"HCCL_EXEC_TIMEOUT": value})
