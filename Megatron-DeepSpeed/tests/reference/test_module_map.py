"""docs/ARCHITECTURE.md's module map (the Layers block) names every package and room of megatron/, and every
file it names exists."""
import os
import re

from tests.helpers.paths import DOCS, PACKAGE_ROOT


def layers_block() -> str:
    with open(os.path.join(DOCS, "ARCHITECTURE.md"), encoding="utf-8") as handle:
        text = handle.read()
    start = text.index("## Layers")
    opening = text.index("```text", start)
    return text[opening:text.index("```", opening + 3)]


def test_every_package_and_room_is_in_the_module_map():
    block, missing = layers_block(), []
    for directory, _, files in os.walk(os.path.join(PACKAGE_ROOT, "megatron")):
        name = os.path.basename(directory)
        if name != "megatron" and any(file.endswith(".py") for file in files) and f"{name}/" not in block:
            missing.append(os.path.relpath(directory, PACKAGE_ROOT))
    assert missing == []


def test_every_file_the_module_map_names_exists():
    present = {file for _, _, files in os.walk(PACKAGE_ROOT) for file in files}
    named = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*\.py\b", layers_block()))
    assert named and sorted(named - present) == []
