"""Megatron-DeepSpeed flags this trainer deliberately does not implement, as data.

Each flag is parsed with upstream's type and default, so an upstream script that passes it at a value that
leaves its feature off (e.g. `--kd` left off) still runs. A value that would turn
the feature on stops the run with one line naming the flag and the feature. Knobs that only tune a feature
(`--topk`, `--kd-temp`, ...) are inert while the feature is off, as upstream; they never stop a run.
After the check, none of these flags is left among the parsed values.
"""
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional

from megatron.errors import InputError


def _differs_from_default(value, default, values) -> bool:
    return value != default


@dataclass(frozen=True)
class UnsupportedFlag:
    """One upstream flag: how argparse reads it, the feature it belongs to, and when it turns that on.
    `turns_on(value, default, values)`; None for a knob that never does on its own. `message` replaces the
    standard sentence (for flags upstream itself removed)."""
    flag: str
    feature: str
    spec: dict = field(default_factory=dict)
    turns_on: Optional[Callable] = _differs_from_default
    message: Optional[str] = None

    @property
    def dest(self) -> str:
        return self.spec.get("dest", self.flag.lstrip("-").replace("-", "_"))

    @property
    def default(self):
        return self.spec.get("default", False if self.spec.get("action") == "store_true" else
                             True if self.spec.get("action") == "store_false" else None)

    def error(self) -> str:
        return self.message or f"{self.flag}: Megatron-DeepSpeed's {self.feature} is not supported by this trainer"


def _knob(flag, feature, **spec):
    return UnsupportedFlag(flag, feature, spec, turns_on=None)


def _switch(flag, feature, turns_on=_differs_from_default, **spec):
    return UnsupportedFlag(flag, feature, spec, turns_on=turns_on)


def _removed(flag, replacement, **spec):
    return UnsupportedFlag(flag, "removed flag", spec,
                           message=f"{flag}: Megatron-DeepSpeed itself no longer accepts it; use {replacement}")


DISTILLATION = "knowledge distillation"
FPDT = "FPDT (fully pipelined distributed transformer) chunked long-context attention"
ZERO_BUBBLE = "zero-bubble (ZB-H1) pipeline schedule"
FP8 = "FP8 training through NVIDIA Transformer Engine"
BIENCODER = "biencoder / ICT / REALM retrieval training"
VIT = "vision transformer (ViT) training"

UNSUPPORTED_FLAGS = (
    # Knowledge distillation / mixture of students.
    _switch("--kd", DISTILLATION, action="store_true"),
    _switch("--mos", "mixture-of-students distillation", action="store_true"),
    _knob("--num-layers-teacher", DISTILLATION, type=int),
    _knob("--num-experts-teacher", DISTILLATION, type=int, nargs="+", default=[1]),
    _knob("--hidden-size-teacher", DISTILLATION, type=int),
    _knob("--num-attention-heads-teacher", DISTILLATION, type=int),
    _knob("--kd-alpha-ce", DISTILLATION, type=float, default=1),
    _knob("--kd-beta-ce", DISTILLATION, type=float, default=1),
    _knob("--kd-temp", DISTILLATION, type=float, default=1.0),
    _knob("--load-teacher", DISTILLATION, type=str),
    # Inference-only modes.
    _switch("--ds-inference", "DeepSpeed inference engine", action="store_true"),
    _switch("--inference", "inference-only mode", action="store_true"),
    # Schedules and engines this trainer replaces with DeepSpeed's.
    _switch("--num-layers-per-virtual-pipeline-stage", "interleaved (virtual) pipeline schedule", type=int),
    _switch("--lazy-mpu-init", "lazy model-parallel initialisation for an external DDP manager", type=bool),
    _switch("--adlr-autoresume", "ADLR cluster auto-resume", action="store_true"),
    _knob("--adlr-autoresume-interval", "ADLR cluster auto-resume", type=int, default=1000),
    _switch("--scattered-embeddings", "scattered-embeddings memory optimisation", action="store_true"),
    _switch("--split-transformers", "split-transformer-layer memory optimisation", action="store_true"),
    _switch("--memory-centric-tiled-linear", "memory-centric tiled linear layers", action="store_true"),
    _knob("--tile-factor", "memory-centric tiled linear layers", type=int, default=1),
    _switch("--aml-data-download-path", "Azure ML data mount prefix (give the full --data-path)", type=str),
    # Model variants GPT pre-training here does not build.
    _switch("--apply-residual-connection-post-layernorm", "post-LayerNorm residual ordering (BERT's)",
            action="store_true"),
    _switch("--fp16-lm-cross-entropy", "fp16 cross entropy (the loss is always computed in fp32)",
            action="store_true"),
    # Other models' flags.
    _switch("--bert-no-binary-head", "BERT pre-training", action="store_false", dest="bert_binary_head"),
    _switch("--mask-prob", "BERT pre-training", type=float, default=0.15),
    _switch("--short-seq-prob", "BERT pre-training", type=float, default=0.1),
    _switch("--sample-rate", "BERT/T5 data sub-sampling", type=float, default=1.0),
    _switch("--vocab-extra-ids", "T5 pre-training", type=int, default=0),
    _switch("--decoder-seq-length", "T5 pre-training", type=int),
    _switch("--retriever-seq-length", BIENCODER, type=int, default=256),
    _switch("--ict-head-size", BIENCODER, type=int),
    _switch("--biencoder-projection-dim", BIENCODER, type=int, default=0),
    _switch("--biencoder-shared-query-context-model", BIENCODER, action="store_true"),
    _switch("--ict-load", BIENCODER, type=str),
    _switch("--bert-load", BIENCODER, type=str),
    _switch("--titles-data-path", BIENCODER, type=str),
    _switch("--query-in-block-prob", BIENCODER, type=float, default=0.1),
    _switch("--use-one-sent-docs", BIENCODER, action="store_true"),
    _switch("--evidence-data-path", BIENCODER, type=str),
    _switch("--retriever-report-topk-accuracies", BIENCODER, nargs="+", type=int, default=[]),
    _switch("--retriever-score-scaling", BIENCODER, action="store_true"),
    _switch("--block-data-path", BIENCODER, type=str),
    _switch("--embedding-path", BIENCODER, type=str),
    _switch("--indexer-batch-size", BIENCODER, type=int, default=128),
    _switch("--indexer-log-interval", BIENCODER, type=int, default=1000),
    _switch("--num-classes", VIT, type=int, default=1000),
    _switch("--img-dim", VIT, type=int, default=224),
    _switch("--num-channels", VIT, type=int, default=3),
    _switch("--patch-dim", VIT, type=int, default=16),
    # Upstream main (2023-2025) features not built here.
    _switch("--force-ds-sequence-parallel", "DeepSpeed-Ulysses attention forced on at size 1 "
            "(--ds-sequence-parallel-size above 1 is supported)", action="store_true"),
    _switch("--ds-sequence-parallel-fpdt", FPDT, action="store_true"),
    _knob("--ds-sequence-parallel-fpdt-chunk-size", FPDT, type=int, default=65536),
    _switch("--ds-sequence-parallel-fpdt-offloading", FPDT, action="store_true"),
    _switch("--enable-zbh1-pipeline", ZERO_BUBBLE, action="store_true"),
    _knob("--enable-zbh1-exact-semantics", ZERO_BUBBLE, action="store_true"),
    _switch("--transformer-impl", "NVIDIA Transformer Engine layers", choices=("local", "transformer_engine"),
            default="local"),
    _switch("--fp8-e4m3", FP8, action="store_true"),
    _switch("--fp8-hybrid", FP8, action="store_true"),
    _knob("--fp8-margin", FP8, type=int, default=0),
    _knob("--fp8-interval", FP8, type=int, default=1),
    _knob("--fp8-amax-history-len", FP8, type=int, default=1),
    _knob("--fp8-amax-compute-algo", FP8, choices=("most_recent", "max"), default="most_recent"),
    _knob("--no-fp8-wgrad", FP8, action="store_false", dest="fp8_wgrad"),
    _switch("--use-distributed-optimizer", "Megatron's distributed optimizer (DeepSpeed's ZeRO stage 1, "
            "--zero-stage 1, shards the same optimizer state)", action="store_true"),
    _switch("--random-ltd", "random layerwise token dropping (DeepSpeed data efficiency)", action="store_true"),
    _switch("--data-efficiency-curriculum-learning", "DeepSpeed data-efficiency curriculum learning (metric "
            "indices of its data analyzer; the DeepSpeed JSON's curriculum_learning section with curriculum_type "
            "seqlen is supported)", action="store_true"),
    _switch("--weight-decay-incr-style", "weight-decay schedule", choices=("constant", "linear", "cosine"),
            default="constant"),
    _knob("--start-weight-decay", "weight-decay schedule", type=float),
    _knob("--end-weight-decay", "weight-decay schedule", type=float),
    # Flags upstream keeps only to reject them.
    _removed("--batch-size", "--micro-batch-size", type=int),
    _removed("--warmup", "--lr-warmup-fraction, --lr-warmup-iters or --lr-warmup-samples", type=int),
    _removed("--model-parallel-size", "--tensor-model-parallel-size", type=int),
)


def add_flags(parser) -> None:
    group = parser.add_argument_group(
        "upstream flags not supported here", "Accepted at values that leave their feature off; see docs/upstream-compatibility.md.")
    for entry in UNSUPPORTED_FLAGS:
        spec = dict(entry.spec)
        spec.setdefault("default", entry.default)
        group.add_argument(entry.flag, help="Not supported: " + entry.feature + ".", **spec)


def supported(values: Mapping) -> dict:
    """The values without these flags; InputError for the first whose value turns on a feature this trainer
    lacks."""
    for entry in UNSUPPORTED_FLAGS:
        if entry.turns_on is not None and entry.turns_on(values[entry.dest], entry.default, values):
            raise InputError(entry.error())
    dropped = {entry.dest for entry in UNSUPPORTED_FLAGS}
    return {dest: value for dest, value in values.items() if dest not in dropped}
