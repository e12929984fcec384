"""An English corpus that needs no download: the docstrings of Python's own standard library.

Every machine that runs this project has it, so the CPU demo and the tests train on real prose
without touching the network. The order is fixed (sorted files, source order inside a file), so
the same Python version always yields the same corpus.
"""
import ast
import inspect
import json
import os
import sysconfig
from pathlib import Path
from typing import Iterator

MIN_DOCSTRING_CHARS = 120
SKIPPED_TOP_LEVEL = ("site-packages", "dist-packages", "test")


def iter_stdlib_docstrings(min_chars: int = MIN_DOCSTRING_CHARS) -> Iterator[str]:
    """Module, class and function docstrings of the pure-Python standard library, long ones only."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(stdlib.rglob("*.py")):
        parts = path.relative_to(stdlib).parts
        if parts[0] in SKIPPED_TOP_LEVEL or any(part in ("test", "tests", "idle_test") for part in parts):
            continue
        try:
            tree = ast.parse(path.read_bytes())
        except (SyntaxError, ValueError, OSError):
            continue  # a few stdlib files are deliberately broken or unreadable; they are not prose anyway
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                text = ast.get_docstring(node, clean=False)
                if text and len(text) >= min_chars:
                    yield inspect.cleandoc(text)


def write_demo_corpus(output_path: str, max_bytes: int | None = None) -> tuple[int, int]:
    """Write the corpus as JSONL ({"text": ...} per line), atomically. Returns (documents, bytes)."""
    output_path = os.fspath(output_path)
    temporary = f"{output_path}.tmp{os.getpid()}"
    documents = written = 0
    try:
        with open(temporary, "w", encoding="utf-8") as out:
            for text in iter_stdlib_docstrings():
                line = json.dumps({"text": text}, ensure_ascii=False) + "\n"
                if max_bytes is not None and written + len(line.encode()) > max_bytes:
                    break
                out.write(line)
                documents += 1
                written += len(line.encode())
        os.replace(temporary, output_path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise
    return documents, written
