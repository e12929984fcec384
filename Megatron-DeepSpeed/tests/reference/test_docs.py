"""The documentation stays true to the code: the generated pages (flags, errors, presets) are current, README is a
front page, every link resolves, every error source has a troubleshooting section, every documented command runs
from the repository root, and no page speaks of how the project was developed."""
import glob
import os
import re
import subprocess
import sys

import pytest

from megatron.config.arguments import _build_parser
from megatron.reference import error_index
from megatron.reference.pages import REGENERATE, stale_pages
from tests.helpers.paths import REPO_ROOT

ROOT = REPO_ROOT
PAGES = sorted(["README.md", "CHANGELOG.md"] + [os.path.relpath(path, ROOT) for path in
                                                 glob.glob(os.path.join(ROOT, "docs", "*.md"))])
# Pages other branches write; links to them are allowed before they arrive.
WRITTEN_ELSEWHERE = {"docs/llama.md", "docs/upstream-main.md", "docs/failure-cases.md"}
COMMAND_PREFIXES = (".venv/bin/python ", ".venv/bin/torchrun ", ".venv/bin/deepspeed ", "bash ", "source ")
# The first word of a code line that is a command (a program, a launcher, or a script named directly).
COMMAND_WORD = re.compile(r"\S*(python\S*|torchrun|deepspeed)|bash|source|cd|sh|\$\S*|PYTHONPATH=\S*|\S+\.(py|sh)")
LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")


def read(page):
    with open(os.path.join(ROOT, page), encoding="utf-8") as text:
        return text.read()


def anchors(page):
    """GitHub's heading anchors of a page: link syntax and punctuation dropped, spaces as hyphens."""
    found = set()
    for line in read(page).splitlines():
        if line.startswith("#"):
            title = LINK.sub(r"\1", line.lstrip("#").strip()).replace("`", "").lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


def code_lines(page):
    """The lines of a page's shell code blocks (fenced without a language, ```shell or ```bash, or indented by four
    spaces after a blank line), with continuations joined. ```text, ```python and the like are not commands."""
    lines, fence, indented, previous_blank = [], None, False, True
    for line in read(page).splitlines():
        if line.startswith("```"):
            fence = None if fence is not None else line[3:].strip() or "shell"
            continue
        indented = line.startswith("    ") and (indented or previous_blank) and fence is None
        if fence in ("shell", "bash") or indented:
            lines.append(line.strip())
        previous_blank = not line.strip()
    joined = []
    for line in lines:
        if joined and joined[-1].endswith("\\"):
            joined[-1] = joined[-1][:-1].rstrip() + " " + line
        else:
            joined.append(line)
    return joined


def documented_commands():
    """(page, command) of every code line that runs a script or a tool."""
    return [(page, line) for page in PAGES for line in code_lines(page)
            if line and COMMAND_WORD.fullmatch(line.split()[0])]


def test_generated_pages_are_current():
    stale = stale_pages(ROOT)
    assert not stale, f"{', '.join(stale)} differ from the code; regenerate with: {REGENERATE}"


def test_every_flag_of_pretrain_gpt_is_in_the_reference():
    reference = read("docs/flags.md")
    missing = [name for action in _build_parser()._actions for name in action.option_strings
               if name not in ("-h", "--help") and f"`{name}`" not in reference]
    assert not missing


def test_readme_is_a_front_page_with_the_two_commands_unchanged():
    readme = read("README.md")
    assert len(readme.encode("utf-8")) < 15_000
    two_commands = readme.split("## Two commands", 1)[1].split("\n## ", 1)[0]
    commands = [line.strip() for line in two_commands.splitlines() if line.startswith("    ") and line.strip()]
    assert commands == ["bash test/train_full_8p.sh", "bash Megatron-DeepSpeed/tools/run_tests.sh"]


@pytest.mark.parametrize("page", PAGES)
def test_every_link_resolves(page):
    broken = []
    for _, target in LINK.findall(read(page)):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        resolved = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        if resolved in WRITTEN_ELSEWHERE:
            continue
        if not os.path.exists(os.path.join(ROOT, resolved)):
            broken.append(target)
        elif anchor and resolved.endswith(".md") and anchor not in anchors(resolved):
            broken.append(target)
    assert not broken


def test_every_error_source_has_its_troubleshooting_section():
    sections = anchors("docs/troubleshooting.md")
    unmapped = {site.path for site in error_index.error_sites(ROOT) if error_index.section_of(site.path) is None}
    assert not unmapped, "add these files to megatron/reference/error_index.py SECTIONS"
    missing = {section for _, section in error_index.SECTIONS if section not in sections}
    assert not missing, "docs/troubleshooting.md lacks these sections"


def test_no_page_speaks_of_how_the_project_was_developed():
    said = [(page, match.group(0)) for page in PAGES for match in
            re.finditer(r"(?i)\b(lent|sessions?|helpers? (wrote|session)|this (task|round|work)|engineers?|agents?)\b", read(page))]
    assert not said


def test_documented_commands_run_from_the_repository_root():
    wrong = [(page, command) for page, command in documented_commands() if not command.startswith(COMMAND_PREFIXES)]
    assert not wrong, "run tools from the repository root with .venv/bin/python (or bash for the shell scripts)"
    missing = [(page, script) for page, command in documented_commands() for script in scripts_of(command)
               if not os.path.exists(os.path.join(ROOT, script))]
    assert not missing


def scripts_of(command):
    return [word for word in command.split() if re.fullmatch(r"[\w./-]+\.(py|sh)", word)][:1]


def tools_to_ask():
    """Each distinct documented Python tool, as the arguments after the interpreter."""
    asked = set()
    for _, command in documented_commands():
        words = command.split()
        if words[0].startswith(".venv/bin/") and "-m" in words[:2]:
            asked.add(("-m", words[words.index("-m") + 1]))
        elif words[0].startswith(".venv/bin/"):
            asked.update((script,) for script in scripts_of(command) if script.endswith(".py"))
    return sorted(asked)


@pytest.mark.full
@pytest.mark.parametrize("tool", tools_to_ask(), ids=" ".join)
def test_documented_tool_answers_help(tool):
    done = subprocess.run([sys.executable, *tool, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout


# --- the generators themselves -----------------------------------------------------------------------------

def test_error_index_reads_messages_as_written_at_the_call(tmp_path):
    module = tmp_path / "Megatron-DeepSpeed" / "megatron" / "example.py"
    module.parent.mkdir(parents=True)
    module.write_text("from megatron.errors import InputError, RunError\n"
                      "def check(value, message):\n"
                      "    if value:\n"
                      "        raise InputError(f'--x {value} is too   large;'\n"
                      "                         ' give less')\n"
                      "    def inner():\n"
                      "        return RunError('stopped: ' + f'{value}')\n"
                      "    raise InputError(message)\n")
    sites = error_index.error_sites(str(tmp_path))
    assert [(site.function, site.kind, site.message) for site in sites] == [
        ("check", "InputError", "--x <...> is too large; give less"), ("check", "RunError", "stopped: <...>")]
    assert error_index.section_of(sites[0].path) == "a-tool-refuses-its-input"


@pytest.mark.parametrize("flag, status", [
    ("--num-layers", "upstream b4d4a0e; works"),
    ("--model-size", "added; works"),
    ("--onnx-safe", "upstream b4d4a0e; accepted without effect"),
    ("--DDP-impl", "upstream b4d4a0e; accepted without effect"),
    ("--kd", "upstream b4d4a0e; refused at a value that turns it on (not supported)"),
    ("--kd-temp", "upstream b4d4a0e; accepted without effect (knowledge distillation is not supported)"),
    ("--batch-size", "upstream b4d4a0e; refused (upstream removed it)"),
])
def test_flag_statuses_come_from_the_upstream_list_and_the_unsupported_table(flag, status):
    from megatron.reference.flag_table import rows
    assert {row.flag: row.status for row in rows(_build_parser(), with_status=True)}[flag] == status


def test_a_generated_block_needs_its_markers():
    from megatron.reference.pages import with_block
    with pytest.raises(ValueError):
        with_block("no markers here\n", "presets", "| table |\n")
