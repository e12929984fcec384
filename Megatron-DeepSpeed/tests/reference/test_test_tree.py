"""Tests mirror modules (docs/ARCHITECTURE.md, "Tests"): every library module with logic,
megatron/<package>/<module>.py, has its tests/<package>/test_<module>.py that imports it directly; a package's
__init__.py with logic has tests/<package>/test_<package>.py, a top-level module tests/test_<module>.py. The
modules still without one are listed below, and the list can only shrink: a module that gains its test must leave
it."""
import ast
import os

from tests.helpers.paths import PACKAGE_ROOT

LIBRARY = os.path.join(PACKAGE_ROOT, "megatron")
TESTS = os.path.join(PACKAGE_ROOT, "tests")

# Library modules with logic that have no mirrored test yet (paths under megatron/). Their behaviour is tested, if
# at all, through other modules' tests; each entry is work left, never a place to add a new module.
WITHOUT_MIRRORED_TEST = frozenset({
    # Moved or added by issue 42's items 1-5 and issues 43-44 (model families, hf/ and checkpoint/reshape,
    # fine-tuning data) without a test at the mirrored path yet: tested through tests/checkpoint/reshape/,
    # tests/families/<name>/ and tests/data/test_sft_*.py.
    "checkpoint/client_state.py", "checkpoint/file_names.py", "hf/conversions.py",
    "hf/directory.py", "hf/examine.py", "hf/files.py",
    "checkpoint/reshape/bf16_slices.py", "checkpoint/reshape/expert_zero_partitions.py",
    "checkpoint/reshape/target_writer.py", "checkpoint/reshape/universal_files.py", "data/sft_data.py",
    "data/sft_demo.py", "families/family.py", "families/gpt2/hf_adapter.py", "families/hf_tensors.py",
    "families/llama/presets.py", "families/qwen2/presets.py",
    "checkpoint/formats/checkpoint.py", "checkpoint/formats/expert_optimizer_state.py",
    "checkpoint/formats/locate.py", "checkpoint/formats/megatron.py", "checkpoint/formats/optimizer_state.py",
    "checkpoint/formats/partitions.py", "checkpoint/formats/pipeline_engine.py",
    "checkpoint/formats/plain_engine.py", "checkpoint/formats/universal.py", "checkpoint/formats/zero0.py",
    "checkpoint/formats/zero12.py", "checkpoint/formats/zero3.py", "checkpoint/parameter_names.py",
    "checkpoint/pointers.py", "checkpoint/shards.py", "checkpoint/trainer/load.py",
    "checkpoint/trainer/nested_module.py", "checkpoint/trainer/resume_plan.py", "inference/command_line.py",
    "inference/distributed.py", "inference/kv_cache.py", "inference/loading.py", "inference/prompts.py",
    "inference/sampling.py", "model/gpt_config.py", "model/kernels.py", "model/parallelize.py", "model/pipe.py",
    "model/provider.py", "model/rotary.py", "model/unfused_attention.py", "planning/command_line.py",
    "planning/memory.py", "planning/moe.py", "planning/search.py", "planning/shape.py", "planning/step_time.py",
    # Tested only through other modules' tests (training's whole runs, config/test_arguments.py, tools/ tests).
    "config/batch_schedule.py", "config/curriculum.py", "config/deepspeed_keys.py", "config/job.py",
    "device_probe.py", "errors.py", "launched_rank.py", "reference/error_index.py", "reference/flag_table.py",
    "reference/pages.py", "reference/tool_help.py", "reports/progress_bar.py", "reports/worker_runs.py",
    "tensor_parallel/deepspeed_checkpointing.py", "tensor_parallel/layers.py", "tensor_parallel/mappings.py",
    "tensor_parallel/random.py", "tensor_parallel/sequence_parallel_grads.py",
})


def has_logic(path: str) -> bool:
    """More than imports and constants: a function or a class."""
    with open(path, encoding="utf-8") as source:
        tree = ast.parse(source.read())
    return any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) for node in ast.walk(tree))


def library_modules() -> list:
    """The library's modules with logic, as paths under megatron/."""
    found = []
    for directory, _, names in os.walk(LIBRARY):
        for name in names:
            path = os.path.join(directory, name)
            if name.endswith(".py") and has_logic(path):
                found.append(os.path.relpath(path, LIBRARY))
    return sorted(found)


def mirrored_test(module: str) -> str:
    """The path of a module's test file under tests/."""
    package, name = os.path.split(module)
    stem = os.path.basename(package) if name == "__init__.py" else name[:-len(".py")]
    return os.path.join(package, f"test_{stem}.py")


def dotted(module: str) -> str:
    parts = os.path.splitext(module)[0].split(os.sep)
    return ".".join(["megatron", *(parts[:-1] if parts[-1] == "__init__" else parts)])


def imported_modules(test_path: str) -> set:
    """Every module a test file imports, `from a.b import c` counted as a.b and a.b.c (c may be a module)."""
    with open(test_path, encoding="utf-8") as source:
        tree = ast.parse(source.read())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def mirrored_and_imported(module: str) -> bool:
    test_path = os.path.join(TESTS, mirrored_test(module))
    return os.path.isfile(test_path) and dotted(module) in imported_modules(test_path)


def test_every_module_with_logic_has_a_mirrored_test_that_imports_it():
    missing = {module for module in library_modules() if not mirrored_and_imported(module)}
    unlisted = sorted(missing - WITHOUT_MIRRORED_TEST)
    assert not unlisted, ("modules without a test that imports them at its mirrored path: "
                          + ", ".join(f"megatron/{module} (tests/{mirrored_test(module)})" for module in unlisted))


def test_the_list_of_modules_without_a_test_only_shrinks():
    """An entry whose module now has its test, or no longer exists, leaves the list."""
    missing = {module for module in library_modules() if not mirrored_and_imported(module)}
    stale = sorted(WITHOUT_MIRRORED_TEST - missing)
    assert not stale, f"remove from WITHOUT_MIRRORED_TEST (tested now, or gone): {', '.join(stale)}"


def test_the_mirror_rule_on_the_three_kinds_of_module():
    assert mirrored_test("files/atomic.py") == os.path.join("files", "test_atomic.py")
    assert mirrored_test("tokenizer/__init__.py") == os.path.join("tokenizer", "test_tokenizer.py")
    assert mirrored_test("device.py") == "test_device.py"
    assert dotted("tokenizer/__init__.py") == "megatron.tokenizer" and dotted("device.py") == "megatron.device"
