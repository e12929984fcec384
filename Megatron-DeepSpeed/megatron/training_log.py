"""The training log lines of docs/ARCHITECTURE.md, Log lines (Megatron-DeepSpeed's exact formats), their parser, and
the throughput figures they report.

Users' scripts grep these lines, so the formats are fixed; the parser reads both our logs and
Megatron-DeepSpeed's own, which may carry extra fields and interleaved lines from other sources.
"""
import math
import re
from dataclasses import dataclass, field

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
    num_zeros: float | None = None
    params_norm: float | None = None


@dataclass(frozen=True)
class ValidationRecord:
    """One evaluation line; prefix is its leading word ("validation", "test")."""
    iteration: int
    loss: float
    ppl: float
    prefix: str = "validation"


@dataclass
class ParsedLog:
    iterations: list[IterationRecord] = field(default_factory=list)
    validations: list[ValidationRecord] = field(default_factory=list)


# Label in the line -> (record field, parser); labels and widths are those of docs/ARCHITECTURE.md, Log lines.
_ITERATION_FIELDS = {
    "consumed samples": ("consumed_samples", int),
    "elapsed time per iteration (ms)": ("elapsed_ms", float),
    "learning rate": ("learning_rate", float),
    "global batch size": ("global_batch_size", int),
    "lm loss": ("lm_loss", float),
    "loss scale": ("loss_scale", float),
    "grad norm": ("grad_norm", float),
    "num zeros": ("num_zeros", float),
    "params norm": ("params_norm", float),
    "number of skipped iterations": ("skipped_iterations", int),
    "number of nan iterations": ("nan_iterations", int),
    "samples per second": ("samples_per_second", float),
    "TFLOPs": ("tflops", float),
}
_ITERATION_HEAD = re.compile(r"(?:^|\s)iteration\s+(\d+)/\s*(\d+)\s*\|")
_VALIDATION_HEAD = re.compile(r"(?:^|\s)(\w+) loss at iteration (\d+) \|")


def perplexity(loss):
    """exp(loss), capped as Megatron does so a diverged loss still prints a finite number."""
    return math.exp(min(PPL_LOSS_CAP, loss))


def iteration_line(iteration, train_iters, consumed_samples, elapsed_ms, learning_rate,
                   global_batch_size, lm_loss, loss_scale, grad_norm, skipped_iterations,
                   nan_iterations, samples_per_second, tflops, num_zeros=None, params_norm=None):
    """The periodic training line, byte for byte as Megatron-DeepSpeed prints it; num_zeros and
    params_norm (--log-num-zeros-in-grad, --log-params-norm) appear only when given."""
    optional = ""
    if num_zeros is not None:
        optional += f" num zeros: {num_zeros:.1f} |"
    if params_norm is not None:
        optional += f" params norm: {params_norm:.3f} |"
    return (f" iteration {iteration:8d}/{train_iters:8d} |"
            f" consumed samples: {consumed_samples:12d} |"
            f" elapsed time per iteration (ms): {elapsed_ms:.1f} |"
            f" learning rate: {learning_rate:.3E} |"
            f" global batch size: {global_batch_size:5d} |"
            f" lm loss: {lm_loss:.6E} |"
            f" loss scale: {loss_scale:.1f} |"
            f" grad norm: {grad_norm:.3f} |{optional}"
            f" number of skipped iterations: {skipped_iterations:3d} |"
            f" number of nan iterations: {nan_iterations:3d} |"
            f" samples per second: {samples_per_second:.3f} |"
            f" TFLOPs: {tflops:.2f} |")


def parameter_count_line(tp_rank, pp_rank, count):
    """What each data-parallel rank 0 prints about its model piece, as Megatron-DeepSpeed prints it."""
    return f" > number of parameters on (tensor, pipeline) model parallel rank ({tp_rank}, {pp_rank}): {count}"


def timers_line(milliseconds):
    """Mean milliseconds per iteration of the --timing-log-level timers, in Megatron's timer-log layout."""
    return "time (ms)" + "".join(f" | {name}: {value:.2f}" for name, value in milliseconds.items())


def validation_lines(iteration, loss, prefix="validation"):
    """The evaluation report: the result line framed by dashed lines one longer than it
    (Megatron's layout, trailing space included)."""
    middle = (f" {prefix} loss at iteration {iteration} |"
              f" lm loss value: {loss:.6E} | lm loss PPL: {perplexity(loss):.6E} | ")
    dashes = "-" * (len(middle) + 1)
    return "\n".join((dashes, middle, dashes))


def tflops_per_device(global_batch_size, seq_length, num_layers, hidden_size, vocab_size,
                      seconds_per_iteration, world_size, checkpoint_activations):
    """Model TFLOP/s per device by Megatron's formula; activation checkpointing repeats the
    forward pass, hence 4 passes' worth of work instead of 3."""
    passes = 4 if checkpoint_activations else 3
    flops = (24 * passes * global_batch_size * seq_length * num_layers * hidden_size ** 2
             * (1 + seq_length / (6 * hidden_size)
                + vocab_size / (16 * num_layers * hidden_size)))
    return flops / (seconds_per_iteration * world_size * 1e12)


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
                            prefix=match.group(1))


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
    return parsed

