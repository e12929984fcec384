"""Reading a JSON object from a file a user gave us: the one place that turns every way it can be wrong
(missing, unreadable, not UTF-8, not JSON, not an object) into an InputError naming the file, the line and
what to do about it."""
import json

from megatron.errors import InputError


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
