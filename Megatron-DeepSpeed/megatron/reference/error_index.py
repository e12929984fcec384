"""Every one-line error the project prints for a user's mistake or a failed run, read from the source: each
`InputError(...)` and `RunError(...)` whose message is written at the call (placeholders shown as `<...>`), with
the file and function it comes from and the troubleshooting section that covers that part of the project."""
import ast
import os
from dataclasses import dataclass
from typing import Iterator, Optional

ERROR_TYPES = ("InputError", "RunError", "NpuSetupError")  # NpuSetupError: deepspeed_npu's InputError
PLACEHOLDER = "<...>"

# Where the errors come from (paths from the repository root) and which section of docs/troubleshooting.md covers
# them; the first matching prefix wins. A source file that matches none fails the documentation test.
SECTIONS = (
    ("Megatron-DeepSpeed/megatron/files/save_dir_lock.py", "a-second-run-on-the-same-save"),
    ("Megatron-DeepSpeed/megatron/checkpoint/trust.py", "a-checkpoint-file-is-refused"),
    ("Megatron-DeepSpeed/megatron/checkpoint/manifest.py", "a-checkpoint-file-is-refused"),
    ("Megatron-DeepSpeed/megatron/checkpoint/", "the-checkpoint-does-not-load"),
    ("Megatron-DeepSpeed/megatron/hf/", "the-checkpoint-does-not-load"),
    ("Megatron-DeepSpeed/megatron/config/", "a-flag-is-refused-at-start"),
    ("Megatron-DeepSpeed/megatron/data/", "the-data-is-refused"),
    ("Megatron-DeepSpeed/megatron/tokenizer/", "the-data-is-refused"),
    ("Megatron-DeepSpeed/megatron/files/", "a-file-cannot-be-read-or-written"),
    ("Megatron-DeepSpeed/megatron/training/", "training-stops"),
    ("Megatron-DeepSpeed/megatron/parallel_state.py", "the-ranks-hang-or-time-out"),
    ("Megatron-DeepSpeed/megatron/device.py", "the-device-is-not-found"),
    ("DeepSpeed/deepspeed_npu/", "the-device-is-not-found"),
    ("Megatron-DeepSpeed/megatron/model/", "a-flag-is-refused-at-start"),
    ("Megatron-DeepSpeed/megatron/planning/", "the-memory-check-refuses-the-layout"),
    ("Megatron-DeepSpeed/megatron/inference/", "generation-or-evaluation-fails"),
    ("Megatron-DeepSpeed/megatron/evaluation/", "generation-or-evaluation-fails"),
    ("Megatron-DeepSpeed/tasks/", "generation-or-evaluation-fails"),
    ("Megatron-DeepSpeed/megatron/reports/", "a-tool-refuses-its-input"),
    ("Megatron-DeepSpeed/tools/launch_training.py", "the-entry-script-stops-before-training"),
    ("Megatron-DeepSpeed/tools/", "a-tool-refuses-its-input"),
    ("Megatron-DeepSpeed/megatron/", "a-tool-refuses-its-input"),
)
SOURCE_ROOTS = ("Megatron-DeepSpeed/megatron", "Megatron-DeepSpeed/tools", "Megatron-DeepSpeed/tasks",
                "Megatron-DeepSpeed/pretrain_gpt.py", "DeepSpeed/deepspeed_npu")


@dataclass(frozen=True)
class ErrorSite:
    path: str        # from the repository root
    function: str    # the enclosing function, or "module"
    kind: str        # one of ERROR_TYPES
    message: str


def section_of(path: str) -> Optional[str]:
    return next((section for prefix, section in SECTIONS if path.startswith(prefix)), None)


def _text(node: ast.AST) -> Optional[str]:
    """The message written at the call: string literals, f-strings (values as placeholders) and their sums."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(part.value if isinstance(part, ast.Constant) else PLACEHOLDER for part in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _text(node.left), _text(node.right)
        return None if left is None and right is None else (left or PLACEHOLDER) + (right or PLACEHOLDER)
    return None


def _called_name(call: ast.Call) -> str:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def _sites_in(path: str, relative: str) -> Iterator[ErrorSite]:
    with open(path, encoding="utf-8") as source:
        tree = ast.parse(source.read(), filename=path)
    functions = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for child in ast.walk(node):
                functions.setdefault(id(child), node.name)  # ast.walk is breadth-first: the outermost wins
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _called_name(node) in ERROR_TYPES and node.args:
            message = _text(node.args[0])
            if message is not None:
                yield ErrorSite(relative, functions.get(id(node), "module"), _called_name(node),
                                " ".join(message.split()))


def _python_files(root: str) -> Iterator[str]:
    for start in SOURCE_ROOTS:
        path = os.path.join(root, start)
        if os.path.isfile(path):
            yield start
            continue
        for directory, subdirectories, files in os.walk(path):
            subdirectories.sort()
            for name in sorted(files):
                if name.endswith(".py"):
                    yield os.path.relpath(os.path.join(directory, name), root)


def error_sites(root: str) -> list:
    """Every error site under the source roots, sorted by file, function and message."""
    sites = [site for relative in _python_files(root)
             for site in _sites_in(os.path.join(root, relative), relative.replace(os.sep, "/"))]
    return sorted(set(sites), key=lambda site: (site.path, site.function, site.message))
