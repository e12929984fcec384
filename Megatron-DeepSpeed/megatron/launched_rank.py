"""A rank started by a launcher (torchrun's agent, the deepspeed launcher) ends when that launcher ends.

torchrun starts every rank in a session of its own, so a SIGKILL of the launcher (a scheduler's kill, an OOM
kill, `kill -9` of the job's process group) leaves the ranks running under PID 1, training and saving unseen
and holding the checkpoint directory's lock. The kernel's parent-death signal (Linux prctl PR_SET_PDEATHSIG)
ends the rank the moment its parent exits; where there is no prctl, a thread watching os.getppid() does it
within a second. The signal is SIGKILL: the rank writes nothing more (a save cut short leaves the last complete
checkpoint named by `latest`, as any SIGKILL mid-save does).

DeepSpeed's `deepspeed` command (deepspeed.launcher.runner) starts its per-node launcher
(deepspeed.launcher.launch, the ranks' parent) as a plain child: a SIGKILL of the command alone leaves that
launcher and its ranks running. So a rank whose parent is that launcher, started by that command on this host,
also ends when the command does (a thread waiting on the command's pidfd, or polling it each second).

A rank whose work succeeded ends its process groups itself (leave_process_groups): left to the interpreter's
teardown, a gloo group's C++ worker threads can still hold finished work whose tensors reference Python objects
when the interpreter is being torn down, and releasing them then aborts the process (SIGABRT, "terminate called
without an active exception"), so a job that finished exits 1 (about 1 run in 25 of a 4-rank generation).
"""
import ctypes
import ctypes.util
import os
import select
import signal
import sys
import threading
import time
from typing import Optional

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_WATCH_SECONDS = 1.0
_DEEPSPEED_NODE_LAUNCHER = "deepspeed.launcher.launch"
_DEEPSPEED_COMMAND = ("deepspeed.launcher.runner", "deepspeed")  # as a module, or the installed script's name


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
    """end_with_parent() for a rank that a launcher started, and the `deepspeed` command above DeepSpeed's
    per-node launcher watched; nothing for a process started by hand."""
    if started_by_a_launcher():
        end_with_parent()
        command = deepspeed_command_above(os.getppid())
        if command is not None:
            threading.Thread(target=_end_when_ended, args=(command,), name="end-with-deepspeed", daemon=True).start()


def leave_process_groups() -> None:
    """Destroy this process's process groups (their worker threads joined) while the interpreter is whole, in a
    process that set them up; call it after success only: a rank whose peer failed mid-collective would wait for
    that peer's work to end."""
    distributed = sys.modules.get("torch.distributed")  # a process that never imported it has no group
    if distributed is not None and distributed.is_available() and distributed.is_initialized():
        distributed.destroy_process_group()


def deepspeed_command_above(parent: int) -> Optional[int]:
    """The pid of the `deepspeed` command that started `parent`, when `parent` is DeepSpeed's per-node launcher
    started by it; else None."""
    if _DEEPSPEED_NODE_LAUNCHER not in _arguments(parent):
        return None
    grandparent = _parent_of(parent)
    arguments = _arguments(grandparent) if grandparent else []
    names = {os.path.basename(argument) for argument in arguments[:3]}
    return grandparent if names & set(_DEEPSPEED_COMMAND) else None


def _arguments(pid: int) -> list:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read().decode(errors="replace").split("\0")
    except OSError:  # no /proc (not Linux), or the process has ended
        return []


def _parent_of(pid: int) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError):
        return None


def _end_when_ended(pid: int) -> None:
    """SIGKILL this process once process `pid` has ended."""
    try:
        watched = os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfd (before Linux 5.3, elsewhere): poll it
        watched = None
    if watched is not None:
        select.select([watched], [], [])  # readable when the process ends
    else:
        while _arguments(pid):
            time.sleep(_WATCH_SECONDS)
    os.kill(os.getpid(), signal.SIGKILL)


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
