"""Result figures of finished training runs: what the entry scripts print at the end, the results
tables of docs/benchmarks.md (the seed project's columns) and loss-curve plots.

A run directory (test/output/<run>/, made by test/train_full_8p.sh or test/train_performance_8p.sh)
holds the training log `train.log` (docs/ARCHITECTURE.md, Log lines lines) and `run.json`, one JSON object describing the
run. Schema of run.json (version 1; other keys are ignored, so the writer may add more):

    model_size          str    preset name, e.g. "345M" (first part of the table's NAME)
    device              str    "cpu", "cuda" or "npu" (shown as CPU / GPU / NPU)
    machine             str    optional: the hardware in words, e.g. "2-core Intel Xeon (x86_64)"
    world_size          int    processes in the whole job
    nproc_per_node      int    processes per node
    seq_length          int    --seq-length
    num_layers          int    --num-layers
    hidden_size         int    --hidden-size
    padded_vocab_size   int    embedding rows after padding (docs/ARCHITECTURE.md, Data formats)
    train_iters         int    --train-iters asked for
    global_batch_size   int    --global-batch-size
    start_time          float  Unix seconds when the launch began (time.time() or `date +%s`)
    end_time            float  Unix seconds when training ended
    ended               str    optional: how: "completed", "stopped on request (...)", "diverged at iteration N",
                               "failed: <the first failing rank's line>", "interrupted (Ctrl-C)"
"""
import math
import os
from dataclasses import astuple, dataclass

from megatron.config.presets import get_preset
from megatron.errors import InputError
from megatron.files.atomic import write_atomically
from megatron.files.user_json import read_json_object
from megatron.tokenizer import vocab_size_with_padding
from megatron.training.flops import format_mfu
from megatron.training.log_lines import ParsedLog, parse_log, perplexity

RUN_INFO_FILE = "run.json"
TRAIN_LOG_FILE = "train.log"
LOSS_CURVE_FILE = "loss_curve.png"

# Warm-up (graph building, JIT, allocator growth) distorts the first records; see steady_state_records.
WARMUP_MIN_RECORDS = 3
WARMUP_FRACTION = 0.1

TABLE_HEADER = ("NAME (device)", "params", "PPL", "samples/s", "TFLOPs", "MFU", "seq_len", "Steps")
DEVICE_LABELS = {"cpu": "CPU", "cuda": "GPU", "npu": "NPU"}
GPT2_VOCAB_SIZE = 50257  # the vocabulary upstream's published runs used
# docs/ARCHITECTURE.md, Presets: upstream Megatron-DeepSpeed on 8 devices, figures as published (text, so "37.8" stays
# "37.8"). PPL was published for 345M only, and the number of steps behind each figure was not.
UPSTREAM_FIGURES = (
    # size               device  PPL       samples/s
    ("345M",             "GPU",  "26.375", "37.8"),
    ("345M",             "NPU",  "26.485", "59.7"),
    ("1.3B",             "GPU",  None,     "15.71"),
    ("1.3B",             "NPU",  None,     "21.47"),
    ("2.7B",             "GPU",  None,     "4.125"),
    ("2.7B",             "NPU",  None,     "5.280"),
    ("3.7B",             "GPU",  None,     "3.120"),
    ("3.7B",             "NPU",  None,     "4.558"),
    ("345M_without_mp",  "GPU",  None,     "235"),
    ("345M_without_mp",  "NPU",  None,     "227"),
)
UPSTREAM_MACHINE = "upstream: Megatron-DeepSpeed's published figures, one node of 8 GPUs / 8 Ascend NPUs"
MISSING_CELL = "-"


@dataclass(frozen=True)
class RunInfo:
    """run.json, checked (see the module docstring for the meaning of each field)."""
    model_size: str
    device: str
    world_size: int
    nproc_per_node: int
    seq_length: int
    num_layers: int
    hidden_size: int
    padded_vocab_size: int
    train_iters: int
    global_batch_size: int
    start_time: float
    end_time: float
    machine: str = ""


@dataclass(frozen=True)
class RunSummary:
    """The figures a run is judged by. best_validation_ppl is None when no validation ran; diverged_at is the
    iteration a diverged run stopped at (or the last one, when it ended with a non-finite loss)."""
    samples_per_second: float
    final_train_ppl: float
    best_validation_ppl: float | None
    steps: int
    duration_seconds: float
    tflops: float | None = None  # per device, mean after warm-up; None where the log has no TFLOPs
    mfu: float | None = None  # mean after warm-up; None where the device's peak is unknown
    diverged_at: int | None = None

    @property
    def reported_ppl(self) -> float:
        """The PPL a run is reported with: the best validation PPL (a full run), else the final training PPL;
        NaN for a diverged run, whose earlier figures are no result."""
        if self.diverged_at is not None:
            return math.nan
        return self.final_train_ppl if self.best_validation_ppl is None else self.best_validation_ppl


@dataclass(frozen=True)
class Run:
    directory: str
    info: RunInfo
    log: ParsedLog
    summary: RunSummary


@dataclass(frozen=True)
class TableRow:
    """One line of the results table, as the text of each cell in TABLE_HEADER order."""
    name: str
    params: str
    ppl: str
    samples_per_second: str
    tflops: str
    mfu: str
    seq_len: str
    steps: str


def gpt_parameter_count(num_layers, hidden_size, seq_length, vocab_size):
    """Parameters of a GPT of this shape (tied LM head, so counted once):
    V·h (word embedding) + s·h (positions) + L·(12h² + 13h) (per block: QKV 3h²+3h, attention
    output h²+h, MLP 4h²+4h and 4h²+h, two LayerNorms 4h) + 2h (final LayerNorm).
    vocab_size is the padded one, since those rows are allocated and trained too."""
    h = hidden_size
    return vocab_size * h + seq_length * h + num_layers * (12 * h * h + 13 * h) + 2 * h


def format_parameter_count(count):
    """Short form as model names use it: 354.9M, 1.31B."""
    for scale, suffix, digits in ((1e9, "B", 2), (1e6, "M", 1), (1e3, "K", 1)):
        if count >= scale:
            return f"{count / scale:.{digits}f}{suffix}"
    return str(count)


def steady_state_records(iterations):
    """The log records throughput is averaged over: all but the first max(3, ceil(10% of them)),
    which carry warm-up. A log too short to have any left is judged by its last record alone."""
    warmup = max(WARMUP_MIN_RECORDS, math.ceil(WARMUP_FRACTION * len(iterations)))
    return iterations[warmup:] or iterations[-1:]


def _throughput(record):
    """samples/s of one record; logs without that field (Megatron-LM's) give it through the
    global batch size and the time per iteration."""
    if record.samples_per_second is not None:
        return record.samples_per_second
    if record.global_batch_size is not None and record.elapsed_ms:
        return record.global_batch_size * 1000.0 / record.elapsed_ms
    return None


def _mean(values):
    """Mean of values, or None when any is missing (a figure the log does not carry throughout)."""
    return None if not values or None in values else sum(values) / len(values)


def summarize(log, info, log_path):
    """RunSummary of a parsed log; log_path only names the file in errors."""
    if not log.iterations:
        raise InputError(f"{log_path}: no iteration lines (' iteration N/ M | ... |'): the run probably "
                         f"failed before its first --log-interval (read the end of the log for the error), "
                         f"or this is not a Megatron training log")
    rates = [rate for rate in map(_throughput, steady_state_records(log.iterations)) if rate is not None]
    if not rates:
        raise InputError(f"{log_path}: the iteration lines after warm-up carry neither 'samples per second' "
                         f"nor 'elapsed time per iteration (ms)' with 'global batch size'; train with "
                         f"Megatron-DeepSpeed's iteration line format")
    losses = [record.lm_loss for record in log.iterations if record.lm_loss is not None]
    if not losses:
        raise InputError(f"{log_path}: no iteration line carries 'lm loss' (every logged iteration was "
                         f"skipped or hit NaN); look at the loss scale and grad norm columns")
    validation_ppls = [record.ppl for record in log.validations if record.prefix == "validation"]
    steady = steady_state_records(log.iterations)
    last = log.iterations[-1]
    ended_non_finite = last.lm_loss is not None and not math.isfinite(last.lm_loss)
    return RunSummary(samples_per_second=sum(rates) / len(rates),
                      tflops=_mean([record.tflops for record in steady]),
                      mfu=_mean([record.mfu for record in steady]),
                      final_train_ppl=perplexity(losses[-1]),
                      best_validation_ppl=min(validation_ppls, default=None),
                      steps=last.iteration,
                      duration_seconds=info.end_time - info.start_time,
                      diverged_at=log.diverged_at or (last.iteration if ended_non_finite else None))


_RUN_INFO_KINDS = {"model_size": str, "device": str, "world_size": int, "nproc_per_node": int,
                   "seq_length": int, "num_layers": int, "hidden_size": int, "padded_vocab_size": int,
                   "train_iters": int, "global_batch_size": int, "start_time": float, "end_time": float}
_EXPECTED = {str: "a non-empty string", int: "a positive whole number",
             float: "a non-negative number (Unix seconds)"}


def _is_valid(value, kind):
    if kind is str:
        return isinstance(value, str) and value != ""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if kind is int:
        return isinstance(value, int) and value > 0
    return value >= 0


def _checked(content, key, kind, path):
    value = content.get(key)
    if not _is_valid(value, kind):
        found = f"is {value!r}" if key in content else "is missing"
        raise InputError(f"{path}: key {key!r} {found}, expected {_EXPECTED[kind]}; the entry scripts "
                         f"write this file (schema in megatron/reports/results.py): rerun them, or fix the key")
    return value


def read_run_info(path):
    """RunInfo from a run.json; InputError says which key is missing or wrong."""
    if not os.path.exists(path):
        raise InputError(f"{path} not found: the entry scripts write it when training ends, so the run "
                         f"did not finish (see {TRAIN_LOG_FILE} beside it), or this is not a run directory")
    content = read_json_object(path, path, "rerun the entry script or fix the file (one JSON object with the "
                                           "keys of megatron/reports/results.py's schema)")
    fields = {key: _checked(content, key, kind, path) for key, kind in _RUN_INFO_KINDS.items()}
    if "machine" in content:
        fields["machine"] = _checked(content, "machine", str, path)
    info = RunInfo(**fields)
    if info.end_time < info.start_time:
        raise InputError(f"{path}: end_time {info.end_time} is before start_time {info.start_time}; both are "
                         f"Unix seconds of the same clock")
    return info


def read_run(directory):
    """Run from a run directory: run.json, train.log, and the figures they give."""
    if not os.path.isdir(directory):
        raise InputError(f"run directory {directory} does not exist; give test/output/<run>/ as made by "
                         f"test/train_full_8p.sh or test/train_performance_8p.sh")
    log_path = os.path.join(directory, TRAIN_LOG_FILE)
    try:
        with open(log_path, encoding="utf-8", errors="replace") as handle:
            log = parse_log(handle)
    except FileNotFoundError:
        raise InputError(f"{log_path} not found: the entry scripts write the training log there; was "
                         f"{directory} made by test/train_*_8p.sh, and did the run start?") from None
    info = read_run_info(os.path.join(directory, RUN_INFO_FILE))
    return Run(directory=directory, info=info, log=log, summary=summarize(log, info, log_path))


def run_name(info):
    """The table's NAME: preset and device, e.g. '345M (NPU)'."""
    return f"{info.model_size} ({DEVICE_LABELS.get(info.device, info.device.upper())})"


def run_label(run):
    """NAME plus the run directory's name, which tells apart runs of the same size and device."""
    return f"{run_name(run.info)} [{os.path.basename(os.path.normpath(run.directory))}]"


def run_row(run):
    info, summary = run.info, run.summary
    params = gpt_parameter_count(info.num_layers, info.hidden_size, info.seq_length, info.padded_vocab_size)
    return TableRow(name=run_name(info), params=format_parameter_count(params),
                    ppl=f"{summary.reported_ppl:.3f}", samples_per_second=f"{summary.samples_per_second:.3f}",
                    tflops=MISSING_CELL if summary.tflops is None else f"{summary.tflops:.3g}",
                    mfu=format_mfu(summary.mfu), seq_len=str(info.seq_length), steps=str(summary.steps))


def upstream_rows(model_size):
    """Upstream's published rows for a preset (none for sizes it did not publish, like tiny); the
    shape comes from our presets, the vocabulary is GPT-2's padded for the preset's TP."""
    rows = []
    for size, device, ppl, rate in UPSTREAM_FIGURES:
        if size != model_size:
            continue
        preset = get_preset(size)
        vocab = vocab_size_with_padding(GPT2_VOCAB_SIZE,
                                        tensor_model_parallel_size=preset["tensor_model_parallel_size"])
        params = gpt_parameter_count(preset["num_layers"], preset["hidden_size"], preset["seq_length"], vocab)
        rows.append(TableRow(name=f"{size} ({device}, upstream)", params=format_parameter_count(params),
                             ppl=ppl or MISSING_CELL, samples_per_second=rate, tflops=MISSING_CELL,
                             mfu=MISSING_CELL, seq_len=str(preset["seq_length"]), steps=MISSING_CELL))
    return rows


def table_rows(runs, with_upstream=False):
    """Rows of our runs in the order given; with_upstream puts upstream's rows for each model size
    right after our rows of that size, so like is beside like."""
    if not with_upstream:
        return [run_row(run) for run in runs]
    rows = []
    for size in dict.fromkeys(run.info.model_size for run in runs):
        rows += [run_row(run) for run in runs if run.info.model_size == size]
        rows += upstream_rows(size)
    return rows


def markdown_table(rows):
    lines = ["| " + " | ".join(TABLE_HEADER) + " |", "|" + "---|" * len(TABLE_HEADER)]
    lines += ["| " + " | ".join(astuple(row)) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def machine_notes(runs, with_upstream=False):
    """Markdown lines under the table: the machine behind each of our runs (the table alone cannot
    name it) and how the figures were made."""
    notes = []
    for run in runs:
        info = run.info
        hardware = f"{info.machine}, " if info.machine else ""
        notes.append(f"- {run_label(run)}: {hardware}{info.world_size} processes "
                     f"({info.nproc_per_node} per node)")
    if with_upstream:
        notes.append(f"- {UPSTREAM_MACHINE}")
    notes.append(f"\nOur runs: PPL = the best validation PPL (exp of the final train lm loss when no validation "
                 f"ran); samples/s = mean over the iteration "
                 f"records after warm-up (the first max({WARMUP_MIN_RECORDS}, {WARMUP_FRACTION:.0%}) of them "
                 f"are skipped).")
    return "\n".join(notes) + "\n"


def summary_lines(summary):
    """The three closing lines of the entry scripts (docs/ARCHITECTURE.md, Log lines), in their exact wording;
    a diverged run says so first, and its PPL is nan."""
    diverged = ("" if summary.diverged_at is None else
                f"Training diverged at iteration {summary.diverged_at}: its loss is not finite, so it has no PPL\n")
    return (f"{diverged}Final Performance samples/sec : {summary.samples_per_second:.3f}\n"
            f"Final Train lm loss PPL(accuracy): {summary.reported_ppl:.3f}\n"
            f"E2E Training Duration sec : {round(summary.duration_seconds)}\n")


def plot_loss_curves(runs, path):
    """One PNG: train loss against iteration as a line per run, validation loss as points in the
    same colour. Drawn with the Agg canvas directly, so no display and no global pyplot state."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 5), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for run in runs:
        label = run_label(run)
        train = [(record.iteration, record.lm_loss) for record in run.log.iterations if record.lm_loss is not None]
        (line,) = axes.plot(*zip(*train), label=f"{label} train")
        validation = [(record.iteration, record.loss) for record in run.log.validations
                      if record.prefix == "validation"]
        if validation:
            axes.plot(*zip(*validation), "o", color=line.get_color(), label=f"{label} validation")
    axes.set_xlabel("iteration")
    axes.set_ylabel("lm loss")
    axes.set_title("Training loss")
    axes.grid(True, alpha=0.3)
    axes.legend()
    write_atomically(path, lambda handle: figure.savefig(handle, format="png"))
