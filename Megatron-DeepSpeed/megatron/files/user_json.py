"""Reading files a user gave us (a JSON object; the lines of a text or JSONL file): the one place that turns
every way they can be wrong (missing, unreadable, not UTF-8, not JSON, not an object) into an InputError naming
the file, the line and what to do about it."""
import json
from typing import List

from megatron.errors import InputError


def read_text_lines(path: str, what: str, fix: str) -> List[str]:
    """The lines of the UTF-8 text file `path`; `what` names it in messages (e.g. "--prompt-file p.txt")."""
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"{what}: cannot read it as UTF-8 text ({err}); {fix}") from None


def read_json_object(path: str, what: str, fix: str) -> dict:
    """The JSON object in `path`. `what` names the file in messages (e.g. "--deepspeed_config ds.json"); `fix`
    says what the user should do instead."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except OSError as err:
        raise InputError(f"{what}: cannot read it ({err.strerror or err}); {fix}") from None
    try:
        content = json.loads(raw)
    except UnicodeDecodeError as err:
        raise InputError(f"{what}: not UTF-8 text ({err.reason} at byte {err.start}); {fix}") from None
    except json.JSONDecodeError as err:
        raise InputError(f"{what}:{err.lineno}:{err.colno}: not valid JSON ({err.msg}); {fix}") from None
    if not isinstance(content, dict):
        raise InputError(f"{what}: the top level must be a JSON object {{...}}, not a JSON "
                         f"{type(content).__name__}; {fix}")
    return content
