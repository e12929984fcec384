"""A rank started by a launcher (torchrun's agent, the deepspeed launcher) ends when that launcher ends.

torchrun starts every rank in a session of its own, so a SIGKILL of the launcher (a scheduler's kill, an OOM
kill, `kill -9` of the job's process group) leaves the ranks running under PID 1, training and saving unseen
and holding the checkpoint directory's lock. The kernel's parent-death signal (Linux prctl PR_SET_PDEATHSIG)
ends the rank the moment its parent exits; where there is no prctl, a thread watching os.getppid() does it
within a second. The signal is SIGKILL: the rank writes nothing more (a save cut short leaves the last complete
checkpoint named by `latest`, as any SIGKILL mid-save does).
"""
import ctypes
import ctypes.util
import os
import signal
import sys
import threading
import time

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_WATCH_SECONDS = 1.0


def started_by_a_launcher() -> bool:
    """torchrun and the deepspeed launcher both give every rank LOCAL_RANK in its environment."""
    return "LOCAL_RANK" in os.environ


def end_with_parent() -> None:
    """SIGKILL this process when its parent process ends. As a Popen preexec_fn it applies to the child, whose
    parent is the caller (on Linux: the kernel's signal survives exec, a watching thread would not)."""
    parent = os.getppid()
    if not _ask_kernel_for_parent_death_signal():
        threading.Thread(target=_watch_parent, args=(parent,), name="end-with-parent", daemon=True).start()
    elif os.getppid() != parent:  # the parent ended before the kernel was asked
        os.kill(os.getpid(), signal.SIGKILL)


def end_with_launcher() -> None:
    """end_with_parent() for a rank that a launcher started; nothing for a process started by hand."""
    if started_by_a_launcher():
        end_with_parent()


def _ask_kernel_for_parent_death_signal() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(_WATCH_SECONDS)
    os.kill(os.getpid(), signal.SIGKILL)
