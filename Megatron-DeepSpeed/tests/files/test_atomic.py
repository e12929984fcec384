"""Atomic writes (megatron/files/atomic.py): a reader sees the old file or the whole new one, never half of it; a
failure leaves no temporary behind; an output directory that exists or overlaps an input is refused in one line."""
import os
import stat

import pytest

from megatron.errors import InputError
from megatron.files.atomic import (check_output_directory, refuse_overlap, write_atomically,
                                   write_directory_atomically, write_text_atomically)


class Interrupted(Exception):
    pass


def half_then_fail(handle):
    handle.write(b"half of the new conte")
    raise Interrupted


def one_line(error) -> str:
    message = str(error.value)
    assert "\n" not in message
    return message


def test_a_write_replaces_the_file_whole_and_world_readable(tmp_path):
    target = tmp_path / "report.json"
    target.write_text("old")
    write_text_atomically(str(target), "new ✓")
    assert target.read_text(encoding="utf-8") == "new ✓"
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o644
    assert os.listdir(tmp_path) == ["report.json"]


def test_a_write_that_fails_halfway_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "report.json"
    target.write_text("old")
    with pytest.raises(Interrupted):
        write_atomically(str(target), half_then_fail)
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["report.json"]


def test_a_write_that_fails_halfway_leaves_no_file_where_there_was_none(tmp_path):
    with pytest.raises(Interrupted):
        write_atomically(str(tmp_path / "new.bin"), half_then_fail)
    assert os.listdir(tmp_path) == []


def test_a_missing_directory_is_one_line_naming_the_path(tmp_path):
    path = str(tmp_path / "absent" / "out.json")
    with pytest.raises(InputError) as error:
        write_text_atomically(path, "x")
    assert one_line(error) == (f"cannot write {path}: directory {tmp_path / 'absent'} does not exist; create it or "
                               "choose another path")


def test_an_existing_output_directory_is_refused_without_force(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(InputError) as error:
        check_output_directory("--save", str(out), force=False, inputs={})
    assert one_line(error) == f"--save {out} already exists; choose another directory, or pass --force to replace it"
    check_output_directory("--save", str(out), force=True, inputs={})


@pytest.mark.parametrize("output, relation", [("src", "is"), (".", "contains"), ("src/inner", "lies inside")])
def test_an_output_overlapping_an_input_is_refused_even_with_force(tmp_path, output, relation):
    (tmp_path / "src").mkdir()
    path = str(tmp_path / output)
    source = str(tmp_path / "src")
    with pytest.raises(InputError) as error:
        refuse_overlap("--output", path, {"--load": source})
    assert one_line(error).startswith(f"--output {path} {relation} --load {source}: the output would replace")


def fill_with(content):
    def fill(directory):
        with open(os.path.join(directory, "data.txt"), "w") as handle:
            handle.write(content)
    return fill


def test_a_directory_appears_whole_and_replaces_one_only_with_force(tmp_path):
    out = str(tmp_path / "dataset")
    write_directory_atomically(out, fill_with("first"))
    assert open(os.path.join(out, "data.txt")).read() == "first"
    with pytest.raises(InputError, match="already exists"):
        write_directory_atomically(out, fill_with("second"))
    write_directory_atomically(out, fill_with("second"), force=True)
    assert open(os.path.join(out, "data.txt")).read() == "second"
    assert sorted(os.listdir(tmp_path)) == ["dataset"]  # no temporary, no old copy, no lock file


def test_a_failed_fill_leaves_the_old_directory_and_no_temporary(tmp_path):
    out = str(tmp_path / "dataset")
    write_directory_atomically(out, fill_with("kept"))

    def failing(directory):
        fill_with("partial")(directory)
        raise Interrupted

    with pytest.raises(Interrupted):
        write_directory_atomically(out, failing, force=True)
    assert open(os.path.join(out, "data.txt")).read() == "kept" and os.listdir(tmp_path) == ["dataset"]


def test_a_directory_that_appears_while_filling_is_kept(tmp_path):
    out = str(tmp_path / "dataset")

    def racing(directory):
        os.mkdir(out)
        fill_with("mine")(directory)

    with pytest.raises(InputError, match="appeared while this run wrote it"):
        write_directory_atomically(out, racing)
    assert os.listdir(out) == [] and os.listdir(tmp_path) == ["dataset"]


def test_a_temporary_left_by_a_killed_writer_is_removed_by_the_next(tmp_path):
    out = str(tmp_path / "dataset")
    os.mkdir(out + ".tmp-killed")
    write_directory_atomically(out, fill_with("new"))
    assert os.listdir(tmp_path) == ["dataset"]
