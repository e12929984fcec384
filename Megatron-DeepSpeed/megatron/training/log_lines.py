"""The training log lines of docs/ARCHITECTURE.md, Log lines (Megatron-DeepSpeed's exact formats), their parser, and
the throughput figures they report.

Users' scripts grep these lines, so the formats are fixed; the parser reads both our logs and
Megatron-DeepSpeed's own, which may carry extra fields and interleaved lines from other sources.
"""
import math
import re
from dataclasses import dataclass, field

from megatron.training.flops import format_mfu

PPL_LOSS_CAP = 20.0


@dataclass(frozen=True)
class IterationRecord:
    """One iteration line. A field the line did not carry is None."""
    iteration: int
    train_iters: int
    consumed_samples: int | None = None
    elapsed_ms: float | None = None
    learning_rate: float | None = None
    global_batch_size: int | None = None
    lm_loss: float | None = None
    loss_scale: float | None = None
    grad_norm: float | None = None
    skipped_iterations: int | None = None
    nan_iterations: int | None = None
    samples_per_second: float | None = None
    tflops: float | None = None
    mfu: float | None = None  # a fraction; None where the line says "n/a" (the device's peak is unknown)
    num_zeros: float | None = None
    params_norm: float | None = None
    moe_loss: float | None = None
    dropped_tokens: int | None = None
    curriculum_seqlen: int | None = None


@dataclass(frozen=True)
class ValidationRecord:
    """One evaluation line; prefix is the split it measured: its leading word ("validation", "test"), or for
    upstream's end-of-run lines the split after "sample draw from"."""
    iteration: int
    loss: float
    ppl: float
    prefix: str = "validation"


@dataclass
class ParsedLog:
    iterations: list[IterationRecord] = field(default_factory=list)
    validations: list[ValidationRecord] = field(default_factory=list)
    diverged_at: int | None = None  # the iteration a run stopped at for divergence
    stopped_on_request: bool = False  # it saved and stopped early for SIGTERM or --exit-duration-in-mins
    peak_allocated_mb: float | None = None  # from the last memory line (memory_line)


# Label in the line -> (record field, parser); labels and widths are those of docs/ARCHITECTURE.md, Log lines.
_ITERATION_FIELDS = {
    "consumed samples": ("consumed_samples", int),
    "elapsed time per iteration (ms)": ("elapsed_ms", float),
    "learning rate": ("learning_rate", float),
    "global batch size": ("global_batch_size", int),
    "lm loss": ("lm_loss", float),
    "moe loss": ("moe_loss", float),
    "dropped tokens": ("dropped_tokens", int),
    "loss scale": ("loss_scale", float),
    "grad norm": ("grad_norm", float),
    "num zeros": ("num_zeros", float),
    "params norm": ("params_norm", float),
    "curriculum seqlen": ("curriculum_seqlen", int),
    "number of skipped iterations": ("skipped_iterations", int),
    "number of nan iterations": ("nan_iterations", int),
    "samples per second": ("samples_per_second", float),
    "TFLOPs": ("tflops", float),
    "MFU": ("mfu", lambda text: None if text == "n/a" else float(text.rstrip("%")) / 100.0),
}
_ITERATION_HEAD = re.compile(r"(?:^|\s)iteration\s+(\d+)/\s*(\d+)\s*\|")
_VALIDATION_HEAD = re.compile(r"(?:^|\s)(\w+) loss at iteration (\d+)(?: on \d+-sample draw from (\w+) set)? \|")
# Our lines for runs that end early (not Megatron's): the start of a divergence error, and the last line of a
# run stopped by a request.
DIVERGED_FORMAT = "training diverged at iteration {iteration}"
_DIVERGED = re.compile(r"training diverged at iteration (\d+)")
_STOPPED_ON_REQUEST = re.compile(r"exiting program at iteration \d+: ")
_PEAK_MEMORY = re.compile(r"\(after \d+ iterations\) memory \(MB\) \|.*\| max allocated: ([0-9.eE+-]+)")


def exit_line(iteration, reason=None):
    """The last line of a run that stops before its last iteration; `reason` for a request (SIGTERM, the
    time limit), none for --exit-interval (Megatron's own line)."""
    return f"exiting program at iteration {iteration}" + (f": {reason}" if reason else "")


def perplexity(loss):
    """exp(loss), capped as Megatron does so a large loss still prints a number; a NaN loss stays NaN."""
    return loss if math.isnan(loss) else math.exp(min(PPL_LOSS_CAP, loss))


def iteration_line(iteration, train_iters, consumed_samples, elapsed_ms, learning_rate,
                   global_batch_size, lm_loss, loss_scale, grad_norm, skipped_iterations,
                   nan_iterations, samples_per_second, tflops, mfu=None, num_zeros=None, params_norm=None,
                   moe_loss=None, dropped_tokens=None, curriculum_seqlen=None):
    """The periodic training line, byte for byte as Megatron-DeepSpeed prints it, plus model FLOPs
    utilisation at the end (megatron/training/flops.py). TFLOPs below 0.01 (a tiny CPU model) keep two significant
    digits instead of rounding to 0.00. num_zeros and params_norm (--log-num-zeros-in-grad, --log-params-norm)
    appear only when given, after the grad norm as upstream puts them. An MoE model's moe_loss follows the lm loss
    as upstream's `moe loss`, then (ours) the expert assignments its gates dropped over the interval. Under a
    sequence-length curriculum, the iteration's length follows as upstream's `curriculum seqlen`."""
    tflops_text = f"{tflops:.2f}" if tflops >= 0.01 or tflops == 0 else f"{tflops:.1e}"
    optional = ""
    if num_zeros is not None:
        optional += f" num zeros: {num_zeros:.1f} |"
    if params_norm is not None:
        optional += f" params norm: {params_norm:.3f} |"
    if curriculum_seqlen is not None:
        optional += f" curriculum seqlen: {curriculum_seqlen:5d} |"
    moe = "" if moe_loss is None else f" moe loss: {moe_loss:.6E} | dropped tokens: {dropped_tokens:d} |"
    return (f" iteration {iteration:8d}/{train_iters:8d} |"
            f" consumed samples: {consumed_samples:12d} |"
            f" elapsed time per iteration (ms): {elapsed_ms:.1f} |"
            f" learning rate: {learning_rate:.3E} |"
            f" global batch size: {global_batch_size:5d} |"
            f" lm loss: {lm_loss:.6E} |{moe}"
            f" loss scale: {loss_scale:.1f} |"
            f" grad norm: {grad_norm:.3f} |{optional}"
            f" number of skipped iterations: {skipped_iterations:3d} |"
            f" number of nan iterations: {nan_iterations:3d} |"
            f" samples per second: {samples_per_second:.3f} |"
            f" TFLOPs: {tflops_text} |"
            f" MFU: {format_mfu(mfu)} |")


def parameter_count_line(tp_rank, pp_rank, count):
    """What each data-parallel rank 0 prints about its model piece, as Megatron-DeepSpeed prints it."""
    return f" > number of parameters on (tensor, pipeline) model parallel rank ({tp_rank}, {pp_rank}): {count}"


def active_parameter_count_line(tp_rank, pp_rank, count):
    """Ours, after upstream's line for an MoE model: the parameters one token uses (top-k experts per MoE layer),
    which the TFLOPs and MFU figures count."""
    return (f" > number of active parameters per token on (tensor, pipeline) model parallel rank ({tp_rank}, "
            f"{pp_rank}): {count}")


def memory_line(rank, iteration, stats):
    """Device memory after `iteration`, in Megatron's report_memory layout; `stats` as device.memory_stats()
    gives them. Printed after the first logged iteration, as upstream, and again after the last one."""
    megabytes = {key: value / 2 ** 20 for key, value in stats.items()}
    return (f"[Rank {rank}] (after {iteration} iterations) memory (MB) | allocated: {megabytes['allocated_bytes']}"
            f" | max allocated: {megabytes['peak_allocated_bytes']} | reserved: {megabytes['reserved_bytes']}"
            f" | max reserved: {megabytes['peak_reserved_bytes']}")


def timers_line(milliseconds):
    """Mean milliseconds per iteration of the --timing-log-level timers, in Megatron's timer-log layout."""
    return "time (ms)" + "".join(f" | {name}: {value:.2f}" for name, value in milliseconds.items())


def validation_lines(iteration, loss, prefix="validation"):
    """The evaluation report: the result line framed by dashed lines one longer than it
    (Megatron's layout, trailing space included)."""
    return _evaluation_block(f" {prefix} loss at iteration {iteration} |", loss)


def final_evaluation_lines(iteration, samples, split, loss):
    """Upstream's report of the evaluation after training (or instead of it, with --skip-train) on the
    `split` ("validation" or "test") set, `samples` samples of it."""
    return _evaluation_block(f" validation loss at iteration {iteration} on {samples}-sample draw from {split} set |",
                             loss)


def _evaluation_block(head, loss):
    middle = f"{head} lm loss value: {loss:.6E} | lm loss PPL: {perplexity(loss):.6E} | "
    dashes = "-" * (len(middle) + 1)
    return "\n".join((dashes, middle, dashes))


def _labelled_values(text):
    """'label: value' pairs of the ' | '-separated fields in text. Only fields closed by '|'
    count, so a line cut off mid-number yields nothing wrong."""
    pairs = {}
    for part in text.split("|")[:-1]:
        label, colon, value = part.partition(":")
        if colon:
            pairs[label.strip()] = value.strip()
    return pairs


def _parse_iteration(match, line):
    values = {}
    for label, text in _labelled_values(line[match.end():]).items():
        if label in _ITERATION_FIELDS:
            name, convert = _ITERATION_FIELDS[label]
            try:
                values[name] = convert(text)
            except ValueError:
                continue
    return IterationRecord(iteration=int(match.group(1)), train_iters=int(match.group(2)),
                           **values)


def _parse_validation(match, line):
    values = _labelled_values(line[match.end():])
    try:
        loss = float(values["lm loss value"])
        ppl = float(values["lm loss PPL"])
    except (KeyError, ValueError):
        return None
    return ValidationRecord(iteration=int(match.group(2)), loss=loss, ppl=ppl,
                            prefix=match.group(3) or match.group(1))


def parse_log(lines):
    """Iteration and validation records from log text (an iterable of lines, or one string).
    Any other line is skipped, so launcher prefixes, DeepSpeed's messages and warnings may be
    interleaved."""
    if isinstance(lines, str):
        lines = lines.splitlines()
    parsed = ParsedLog()
    for line in lines:
        head = _ITERATION_HEAD.search(line)
        if head:
            parsed.iterations.append(_parse_iteration(head, line))
            continue
        head = _VALIDATION_HEAD.search(line)
        record = head and _parse_validation(head, line)
        if record:
            parsed.validations.append(record)
            continue
        memory = _PEAK_MEMORY.search(line)
        if memory:
            parsed.peak_allocated_mb = float(memory.group(1))
            continue
        diverged = _DIVERGED.search(line)
        if diverged and parsed.diverged_at is None:
            parsed.diverged_at = int(diverged.group(1))
        parsed.stopped_on_request = parsed.stopped_on_request or bool(_STOPPED_ON_REQUEST.search(line))
    return parsed

