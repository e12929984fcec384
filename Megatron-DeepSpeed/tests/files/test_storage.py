"""Why a write failed, in words (megatron/files/storage.py): the errno when the error has one, else the cause read
from the directory (the file-size limit, less free space than needed), with the figures that matter."""
import errno
import os
import resource

from megatron.files.storage import (directory_bytes, file_size_limit, free_bytes, fsync_tree, megabytes,
                                    write_failure_cause)

OPAQUE = RuntimeError("[enforce fail at inline_container.cc:778] . PytorchStreamWriter failed writing file")


def test_an_error_with_an_errno_is_named_by_it(tmp_path):
    assert write_failure_cause(str(tmp_path), OSError(errno.EROFS, "Read-only"), 10) == (
        "the file system is read-only (EROFS)")
    full = write_failure_cause(str(tmp_path), OSError(errno.ENOSPC, "No space"), 10 ** 18)
    assert full.startswith("the disk is full (ENOSPC): ") and full.endswith(
        f"free there, about {megabytes(10 ** 18)} needed")


def test_a_full_disk_with_room_now_says_the_estimate_was_low(tmp_path):
    cause = write_failure_cause(str(tmp_path), OSError(errno.ENOSPC, "No space"), 1)
    assert "now that the failed write's files are gone, yet it ran out while writing" in cause


def test_an_opaque_error_where_more_is_needed_than_is_free_is_a_full_disk(tmp_path):
    free = free_bytes(str(tmp_path))
    assert write_failure_cause(str(tmp_path), OPAQUE, free + 10 ** 12) == (
        f"the disk is full (ENOSPC): {megabytes(free)} free there, about {megabytes(free + 10 ** 12)} needed")


def test_an_opaque_error_with_room_to_spare_is_passed_on_as_it_is(tmp_path):
    assert write_failure_cause(str(tmp_path), OPAQUE, 1) == f"RuntimeError: {OPAQUE}"


def test_an_opaque_error_under_a_file_size_limit_names_the_limit(tmp_path):
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 30, hard))
    try:
        assert file_size_limit() == 1 << 30
        assert write_failure_cause(str(tmp_path), OPAQUE, 1) == (
            f"a file exceeds the file-size limit (EFBIG): ulimit -f allows {1 << 30} bytes per file")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert file_size_limit() == (None if soft == resource.RLIM_INFINITY else soft)


def test_sizes_and_flushing_a_tree(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.bin").write_bytes(b"1234")
    (tmp_path / "y.bin").write_bytes(b"12")
    fsync_tree(str(tmp_path))
    assert directory_bytes(str(tmp_path)) == 6
    assert megabytes(2_500_000) == "2.5 MB"
    assert free_bytes(str(tmp_path / "absent")) is None and free_bytes(str(tmp_path)) > 0
    assert os.listdir(tmp_path / "a") == ["x.bin"]
