"""Files a user hands us (megatron/files/user_json.py): each way they can be wrong is one line naming the file
(and the line and column of a JSON mistake) and the fix."""
import pytest

from megatron.errors import InputError
from megatron.files.user_json import read_json_object, read_text_lines

FIX = "give a DeepSpeed JSON file"


def refusal(read, path) -> str:
    with pytest.raises(InputError) as error:
        read(str(path), f"--deepspeed_config {path.name}", FIX)
    message = str(error.value)
    assert "\n" not in message and message.endswith(FIX)
    return message


def test_a_json_object_is_read(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text('{"train_batch_size": 8}')
    assert read_json_object(str(path), "--deepspeed_config ds.json", FIX) == {"train_batch_size": 8}


def test_a_missing_file(tmp_path):
    assert refusal(read_json_object, tmp_path / "ds.json") == (
        f"--deepspeed_config ds.json: cannot read it (No such file or directory); {FIX}")


def test_invalid_json_names_its_line_and_column(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text('{\n  "train_batch_size": 8,\n}')
    assert refusal(read_json_object, path).startswith("--deepspeed_config ds.json:3:1: not valid JSON (")


def test_bytes_that_are_not_utf8(tmp_path):
    path = tmp_path / "ds.json"
    path.write_bytes(b'{"a": "\xff"}')
    assert refusal(read_json_object, path).startswith("--deepspeed_config ds.json: not UTF-8 text (invalid start "
                                                      "byte at byte 7)")


def test_a_top_level_that_is_not_an_object(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text("[1, 2]")
    assert refusal(read_json_object, path) == (
        f"--deepspeed_config ds.json: the top level must be a JSON object {{...}}, not a JSON list; {FIX}")


def test_text_lines_and_their_refusals(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("first\nsecond ✓\n", encoding="utf-8")
    assert read_text_lines(str(path), "--prompt-file prompts.txt", FIX) == ["first", "second ✓"]
    path.write_bytes(b"\xff\xfe")
    assert "cannot read it as UTF-8 text" in refusal(read_text_lines, path)
    assert "cannot read it as UTF-8 text" in refusal(read_text_lines, tmp_path / "absent.txt")
