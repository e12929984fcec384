"""One writer at a time (megatron/files/sole_writer.py), between real processes: the POSIX lock is per process, so
a second writer is another process; it is refused at once, naming the first, and takes the lock once the first
ends, however it ended."""
import os
import subprocess
import sys

import pytest

from megatron.files.sole_writer import SoleWriter
from tests.helpers.paths import PACKAGE_ROOT

HOLD = ("import sys; from megatron.files.sole_writer import SoleWriter; "
        "SoleWriter(sys.argv[1], RuntimeError); print('held', flush=True); sys.stdin.read()")


class Refused(Exception):
    pass


@pytest.fixture
def holder(tmp_path):
    """Another process holding tmp_path/out.lock until its stdin closes or it is killed."""
    lock = str(tmp_path / "out.lock")
    process = subprocess.Popen([sys.executable, "-c", HOLD, lock], cwd=PACKAGE_ROOT, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline() == "held\n"
    yield lock, process
    process.kill()
    process.wait()


@pytest.mark.full
def test_a_second_writer_is_refused_naming_the_first_then_takes_over_when_it_is_killed(holder):
    lock, process = holder
    with pytest.raises(Refused) as refused:
        SoleWriter(lock, Refused)
    assert str(refused.value).startswith(f"pid {process.pid} on host ")
    process.kill()
    process.wait()
    writer = SoleWriter(lock, Refused)  # the kernel dropped the killed holder's lock
    writer.release()
    assert not os.path.exists(lock)


def test_a_writer_removes_its_lock_file_on_release_and_release_twice_is_harmless(tmp_path):
    lock = str(tmp_path / "out.lock")
    writer = SoleWriter(lock, Refused)
    assert os.path.exists(lock)
    writer.release()
    writer.release()
    assert os.listdir(tmp_path) == []
    SoleWriter(lock, Refused).release()  # the next writer takes it
