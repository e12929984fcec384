"""Rows of the flag reference, read from the parsers: pretrain_gpt.py's (every group, with each flag's status
against upstream b4d4a0e and the unsupported table) and the entry scripts' own options."""
import argparse
from dataclasses import dataclass
from typing import Iterator

from megatron.config.flags.unsupported import UNSUPPORTED_FLAGS
from megatron.config.upstream_flags import b4d4a0e_flag_names

# Help texts of flags kept only so upstream scripts run start so (the flag groups' wording).
_NO_EFFECT_OPENINGS = ("Accepted", "No effect")


@dataclass(frozen=True)
class FlagRow:
    group: str
    flag: str
    aliases: tuple
    default: str
    status: str
    help: str


def _default(action: argparse.Action) -> str:
    if action.default is None or action.default == argparse.SUPPRESS:
        return "-"
    return repr(action.default)


def _unsupported_status(flag: str):
    entry = next((entry for entry in UNSUPPORTED_FLAGS if entry.flag == flag), None)
    if entry is None:
        return None
    if entry.message is not None:
        return "refused (upstream removed it)"
    if entry.turns_on is None:
        return f"accepted without effect ({entry.feature} is not supported)"
    return "refused at a value that turns it on (not supported)"


def _effect(action: argparse.Action, group: argparse._ArgumentGroup) -> str:
    unsupported = _unsupported_status(action.option_strings[0])
    if unsupported is not None:
        return unsupported
    help_text = action.help or group.description or ""
    return "accepted without effect" if help_text.startswith(_NO_EFFECT_OPENINGS) else "works"


def _origin(action: argparse.Action, upstream: frozenset) -> str:
    return "upstream b4d4a0e" if any(name in upstream for name in action.option_strings) else "added"


def rows(parser: argparse.ArgumentParser, with_status: bool) -> Iterator[FlagRow]:
    """One row per option of `parser`, in --help order (help itself left out)."""
    upstream = b4d4a0e_flag_names()
    for group in parser._action_groups:
        for action in group._group_actions:
            if isinstance(action, argparse._HelpAction):
                continue
            status = f"{_origin(action, upstream)}; {_effect(action, group)}" if with_status else ""
            yield FlagRow(group=group.title, flag=action.option_strings[0], aliases=tuple(action.option_strings[1:]),
                          default=_default(action), status=status,
                          help=" ".join((action.help or group.description or "").split()))


def markdown_table(table_rows, with_status: bool) -> str:
    head = ["group", "flag", "aliases", "default"] + (["status"] if with_status else []) + ["help"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in table_rows:
        cells = [row.group, f"`{row.flag}`", ", ".join(f"`{alias}`" for alias in row.aliases), row.default]
        cells += [row.status] if with_status else []
        cells += [row.help]
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines)
