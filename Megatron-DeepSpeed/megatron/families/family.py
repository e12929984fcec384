"""A model family as the rest of the code sees it (Family), and one row of the --model-size table (Preset)."""
from dataclasses import dataclass, field
from typing import Mapping, Tuple

from megatron.families.adapter import HFAdapter

FULL_RUN_ITERS = 500000
FULL_RUN_LR_DECAY_ITERS = 320000


@dataclass(frozen=True)
class Preset:
    """One --model-size preset, in the column order of docs/training.md's table; `model_flags`: the architecture
    flags it sets beyond the shape (its family's, and sizes such as the FFN width), argparse names."""
    name: str
    tp: int
    pp: int
    layers: int
    hidden: int
    heads: int
    seq: int
    micro_bs: int
    global_bs: int
    lr: float
    min_lr: float
    no_pipeline: bool = False
    full_run_iters: int = FULL_RUN_ITERS
    lr_decay_iters: int = FULL_RUN_LR_DECAY_ITERS
    experts: int = 1  # mixture of experts in every second layer (upstream's --expert-interval 2) when above 1
    expert_parallel: int = 1
    model_flags: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class Family:
    """A family: its transformers adapter, the requirement an export states when no family holds a model, and
    its presets."""
    name: str
    adapter: HFAdapter
    needs: str  # what a model needs to be held by this family's transformers class, for the refusal's line
    presets: Tuple[Preset, ...] = ()
