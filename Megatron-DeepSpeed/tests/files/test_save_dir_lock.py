"""One writer per --save, between real processes: while one process holds a --save directory, a training run
started on it stops at start-up in one line naming the holder's host and pid, and writes nothing there; a
holder killed with SIGKILL leaves a stale lock that the next run reports (host and pid) and takes over."""
import logging
import os
import signal
import socket
import subprocess
import sys

import pytest
from tests.training.test_run_failures import ROOT, assert_one_line_error, run_pretrain

from megatron.files import save_dir_lock as save_lock

pytestmark = pytest.mark.full  # several processes

HOLDER = ("import sys; from megatron.files import save_dir_lock; save_dir_lock.hold(sys.argv[1]); "
          "print('held', flush=True); sys.stdin.read()")


def start_holder(save):
    process = subprocess.Popen([sys.executable, "-c", HOLDER, save], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True, cwd=ROOT)
    assert process.stdout.readline() == "held\n"
    return process


def test_a_second_run_on_a_held_save_stops_at_start_up_naming_the_first(data_prefix, tmp_path):
    save = str(tmp_path / "ck")
    os.makedirs(save)
    holder = start_holder(save)
    try:
        result = run_pretrain(data_prefix, "--train-iters", "2", "--save", save, "--save-interval", "1")
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert_one_line_error(result, 2, f"--save {save} is in use by another run (host {socket.gethostname()}, pid "
                                     f"{holder.pid}, started ", "choose another --save")
    assert sorted(os.listdir(save)) == [save_lock.LOCK_FILE]


def test_a_killed_holder_leaves_a_stale_lock_that_is_reported_and_taken_over(tmp_path, caplog):
    save = str(tmp_path)
    holder = start_holder(save)
    with pytest.raises(Exception, match=f"pid {holder.pid}"):
        save_lock.hold(save)
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=60)
    with caplog.at_level(logging.WARNING, logger="megatron"):
        save_lock.hold(save)
    try:
        assert f"the run that last saved there ended without releasing it (host {socket.gethostname()}, pid " \
               f"{holder.pid}, started " in caplog.text
        save_lock.hold(save)  # this process again: still its own lock
    finally:
        save_lock.release_all()
    assert open(os.path.join(save, save_lock.LOCK_FILE)).read() == ""  # a clean end leaves no stale record
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="megatron"):
        save_lock.hold(save)
    save_lock.release_all()
    assert "ended without releasing" not in caplog.text
