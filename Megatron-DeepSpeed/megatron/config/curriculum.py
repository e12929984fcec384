"""The sequence-length curriculum of a user's DeepSpeed JSON: its top-level `curriculum_learning` section, as
Megatron-DeepSpeed's curriculum_learning/ and rebase/*_slw.sh templates write it, checked here.

Upstream's trainer (b4d4a0e and main alike) hands that section to DeepSpeed's CurriculumScheduler and truncates
every training batch to the scheduler's current difficulty. Current DeepSpeed refuses the section in the engine's
config, so the engine never sees it (ds_config.py drops it); the training loop drives the scheduler itself
(megatron/training/curriculum.py). What DeepSpeed's scheduler would only assert is checked here, in one line each,
before any process starts.
"""
from types import MappingProxyType
from typing import Any, Mapping, Optional

from megatron.errors import InputError

SECTION = "curriculum_learning"
SEQLEN = "seqlen"
# schedule_type -> the schedule_config keys DeepSpeed's CurriculumScheduler reads for it
SCHEDULE_KEYS = {"fixed_linear": ("total_curriculum_step", "difficulty_step"),
                 "fixed_root": ("total_curriculum_step", "difficulty_step", "root_degree"),
                 "fixed_discrete": ("difficulty", "max_step")}


def _where(path: Optional[str], key: str) -> str:
    return f"--deepspeed_config {path} sets {SECTION}.{key}"


def _positive_int(value: Any, what: str, path: Optional[str]) -> int:
    """`value` (read from `what` of the section) if it is a whole number of at least 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"--deepspeed_config {path}: {SECTION}.{what}: {value!r} is not a positive whole number")
    return value


def _lengths_of_schedule(section: Mapping, path: Optional[str], seq_length: int) -> tuple:
    """The lengths the schedule may produce besides max_difficulty: its difficulty_step's multiples (linear, root)
    or its listed difficulties (discrete), given as (what, value) pairs for the divisibility check."""
    schedule_type = section.get("schedule_type")
    if schedule_type == "custom":
        raise InputError(f"{_where(path, 'schedule_type')}=\"custom\", a schedule given as Python code to DeepSpeed's "
                         f"engine, which this trainer cannot take from a JSON file; use fixed_linear, fixed_root or "
                         f"fixed_discrete")
    if schedule_type not in SCHEDULE_KEYS:
        raise InputError(f"{_where(path, 'schedule_type')}={schedule_type!r}; use one of "
                         f"{', '.join(SCHEDULE_KEYS)}")
    config = section.get("schedule_config")
    missing = [key for key in SCHEDULE_KEYS[schedule_type] if not isinstance(config, Mapping) or key not in config]
    if missing:
        raise InputError(f"--deepspeed_config {path}: {SECTION}.schedule_config needs {', '.join(missing)} for "
                         f"schedule_type {schedule_type}; add them")
    if schedule_type != "fixed_discrete":
        for key in SCHEDULE_KEYS[schedule_type]:
            _positive_int(config[key], f"schedule_config.{key}", path)
        return (("schedule_config.difficulty_step", config["difficulty_step"]),)
    difficulties, max_steps = config["difficulty"], config["max_step"]
    if not isinstance(difficulties, list) or not isinstance(max_steps, list) or not max_steps or \
            len(difficulties) != len(max_steps) + 1:
        raise InputError(f"--deepspeed_config {path}: {SECTION}.schedule_config needs a list of difficulty one "
                         f"longer than its non-empty list of max_step (the last difficulty holds after the last "
                         f"step); it has {difficulties!r} and {max_steps!r}")
    for key, values in (("difficulty", difficulties), ("max_step", max_steps)):
        for value in values:
            _positive_int(value, f"schedule_config.{key}", path)
    if any(later < earlier for earlier, later in zip(difficulties, difficulties[1:])) or \
            any(later <= earlier for earlier, later in zip(max_steps, max_steps[1:])):
        raise InputError(f"--deepspeed_config {path}: {SECTION}.schedule_config has difficulty {difficulties!r} and "
                         f"max_step {max_steps!r}; the lengths must not decrease and the steps must increase (a "
                         "curriculum grows its sequences)")
    if max(difficulties) > seq_length:
        raise InputError(f"{_where(path, 'schedule_config.difficulty')}={difficulties!r}, longer than --seq-length "
                         f"{seq_length} (the samples' length); use lengths up to {seq_length}")
    return tuple(("schedule_config.difficulty", value) for value in difficulties)


def seqlen_curriculum(user_json: Optional[Mapping[str, Any]], path: Optional[str], seq_length: int,
                      sequence_parallel_size: int = 1) -> Optional[Mapping[str, Any]]:
    """The checked `curriculum_learning` section of the user's JSON when it is enabled (None otherwise), read-only,
    as DeepSpeed's CurriculumScheduler takes it. Every length it can give must be at most --seq-length (the
    samples hold that many tokens) and, with --sequence-parallel, a multiple of the tensor-parallel size
    `sequence_parallel_size`, which splits each sequence."""
    section = None if user_json is None else user_json.get(SECTION)
    if section is None:
        return None
    if not isinstance(section, Mapping):
        raise InputError(f"--deepspeed_config {path} sets {SECTION} to {section!r}; it must be an object "
                         "({\"enabled\": true, ...}), or be left out")
    enabled = section.get("enabled", False)
    if not isinstance(enabled, bool):
        raise InputError(f"{_where(path, 'enabled')}={enabled!r}; it must be true or false (a JSON boolean, not a "
                         "string)")
    if not enabled:
        return None
    curriculum_type = section.get("curriculum_type")
    if curriculum_type != SEQLEN:
        raise InputError(f"{_where(path, 'curriculum_type')}={curriculum_type!r}: only the sequence-length "
                         f"curriculum (\"seqlen\") is supported by this trainer; set it to \"seqlen\" or set "
                         f"{SECTION}.enabled to false")
    smallest = _positive_int(section.get("min_difficulty"), "min_difficulty", path)
    largest = _positive_int(section.get("max_difficulty"), "max_difficulty", path)
    if smallest > largest or largest > seq_length:
        raise InputError(f"--deepspeed_config {path}: {SECTION} grows sequences from min_difficulty {smallest} to "
                         f"max_difficulty {largest}, which must satisfy min <= max <= --seq-length {seq_length}")
    lengths = (("max_difficulty", largest),) + _lengths_of_schedule(section, path, seq_length)
    if sequence_parallel_size > 1:
        for what, value in lengths:
            if value % sequence_parallel_size:
                raise InputError(f"{_where(path, what)} {value}, but --sequence-parallel splits every sequence over "
                                 f"--tensor-model-parallel-size {sequence_parallel_size}; use multiples of "
                                 f"{sequence_parallel_size}")
    return MappingProxyType(dict(section))
