"""Python signatures read from ATen operator schemas (op-plugin's op_plugin_functions.yaml), so that a stand-in
for a torch_npu operator can be checked to take exactly the operator's arguments, names and defaults."""
import inspect
import re

SCHEMA_KEYWORDS = {"None": None, "True": True, "False": False}


def schema_default(text: str):
    """A schema default as Python reads it: None / True / False, a quoted string, an int or a float."""
    if text in SCHEMA_KEYWORDS:
        return SCHEMA_KEYWORDS[text]
    if text[0] in "'\"":
        return text[1:-1]
    return float(text) if any(mark in text for mark in ".e") else int(text)


def schema_parameters(schema: str) -> list:
    """[(name, default or inspect.Parameter.empty)] of an ATen schema string."""
    arguments = re.fullmatch(r"\w+\((.*)\) -> .*", schema).group(1)
    parameters = []
    for argument in arguments.split(", "):
        name, _, default = argument.split(" ", 1)[1].partition("=")
        parameters.append((name, schema_default(default) if default else inspect.Parameter.empty))
    return parameters


def signature_parameters(function) -> list:
    """[(name, default)] of a stand-in, every parameter positional-or-keyword as an ATen operator's."""
    parameters = inspect.signature(function).parameters.values()
    assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in parameters)
    return [(p.name, p.default) for p in parameters]
