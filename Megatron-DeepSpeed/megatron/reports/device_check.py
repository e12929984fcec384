"""The accelerator check: is training on this device correct, and how fast is it?

Correctness: the model's fp32 logits and loss on the device against the CPU's for the same weights and batch;
short bf16 and fp16 (DeepSpeed's dynamic loss scaling) runs against the fp32 loss curve; activation
recomputation against none. Kernels: which scaled-dot-product-attention kernel PyTorch really dispatches the
causal path to (flash, where the device has it). Speed: a small grid of settings for each model size on ONE
device, each timed after warm-up from the trainer's own log lines (samples/s, TFLOPs, MFU) with the device's
peak memory, beside the layout planner's estimate for the same flags (megatron/planning, its fragmentation
allowance left out, as the allocator's peak of allocated bytes has none).
Every run trains on synthetic tokens (--mock-data), so no data files are needed: the correctness runs through
training.pretrain in this process, each speed cell as pretrain_gpt.py in a process of its own.
On a CPU the same report runs at toy sizes: that is how CI keeps this code working.
"""
import copy
import functools
import io
import logging
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

import torch

from megatron import device
from megatron.config.presets import get_preset
from megatron.errors import InputError
from megatron.model.attention_spec import AttentionSpec
from megatron.model.gpt import GPTConfig, GPTModel
from megatron.model.kernels import sdpa_attention
from megatron.planning.command_line import planned_memory
from megatron.training.flops import format_mfu
from megatron.training.log_lines import parse_log


def preset_shape(preset: str, name: Optional[str] = None) -> tuple:
    """(name, layers, hidden, heads, seq) of a --model-size preset (config/presets.py), named `name` or its own."""
    values = get_preset(preset)
    return (name or preset, values["num_layers"], values["hidden_size"], values["num_attention_heads"],
            values["seq_length"])


# Model shapes: (name, layers, hidden, heads, seq); the accelerator sizes are the 345M and 1.3B presets'. The MoE
# shapes are the dense ones with experts in every other layer (upstream's --expert-interval 2), top-1 routing, all
# experts on the one device (expert-parallel size 1).
ACCELERATOR_SHAPES = (preset_shape("345M"), preset_shape("1.3B"), preset_shape("345M", "345M-MoE8"))
CPU_SHAPES = (("toy", 2, 64, 4, 64), ("toy-MoE4", 2, 64, 4, 64))
SHAPE_FLAGS = {"345M-MoE8": ("--num-experts", "8"), "toy-MoE4": ("--num-experts", "4")}
CORRECTNESS_SHAPES_ACCELERATOR = (preset_shape("tiny"), preset_shape("345M"))
CORRECTNESS_SHAPES_CPU = (("toy", 2, 64, 4, 64),)
VOCAB = 50257  # GPT-2's: the logit layer's share of the work is realistic
GIB = 1 << 30


@dataclass(frozen=True)
class SpeedRow:
    shape: str
    settings: str
    samples_per_second: float = 0.0
    tokens_per_second: float = 0.0
    tflops: float = 0.0
    mfu: Optional[float] = None
    peak_memory_gib: float = 0.0
    planned_memory_gib: Optional[float] = None  # the layout planner's estimate for the cell's flags
    failure: Optional[str] = None  # why the run did not finish (e.g. out of memory); the figures are then empty


def logits_match_cpu(name: str, layers: int, hidden: int, heads: int, seq: int) -> float:
    """Largest relative difference between the device's and the CPU's fp32 logits (and loss) for one batch."""
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=1024, max_position_embeddings=seq, num_layers=layers, hidden_size=hidden,
                       num_attention_heads=heads, hidden_dropout=0.0, attention_dropout=0.0)
    cpu_model = GPTModel(config).eval()
    device_model = copy.deepcopy(cpu_model).to(device.current_device())
    tokens = torch.randint(0, 1024, (2, seq + 1), generator=torch.Generator().manual_seed(1))
    inputs, labels = tokens[:, :-1], tokens[:, 1:]
    target = device.current_device()
    with torch.no_grad():
        cpu_logits, cpu_loss = cpu_model(inputs), cpu_model(inputs, labels=labels)
        got_logits = device_model(inputs.to(target)).cpu()
        got_loss = device_model(inputs.to(target), labels=labels.to(target)).cpu()
    logit_error = ((got_logits - cpu_logits).abs().max() / cpu_logits.abs().max()).item()
    loss_error = abs(got_loss.item() - cpu_loss.item()) / abs(cpu_loss.item())
    return max(logit_error, loss_error)


def attention_kernel(attention: Callable, heads: int, seq: int, head_dim: int,
                     dtype: torch.dtype = torch.bfloat16) -> str:
    """The ATen operator PyTorch dispatches `attention` to on the causal path (no mask) in `dtype` with its default
    backend choice, e.g. aten::_scaled_dot_product_flash_attention: the kernel that really runs in training.
    Read from the profiler's operator names, so it works on any device; 'not an SDPA kernel' for an adaptor's own
    attention."""
    query = torch.randn(2, heads, seq, head_dim, dtype=dtype, device=device.current_device())
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        attention(query, query, query, AttentionSpec())
    kernels = [event.name for event in profile.events() if event.name.startswith("aten::_scaled_dot_product_")]
    return kernels[-1] if kernels else "not an SDPA kernel"


def shape_flags(layers: int, hidden: int, heads: int, seq: int) -> List[str]:
    return ["--num-layers", str(layers), "--hidden-size", str(hidden), "--num-attention-heads", str(heads),
            "--seq-length", str(seq), "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size",
            str(VOCAB), "--hidden-dropout", "0", "--attention-dropout", "0", "--lr", "1e-4", "--min-lr", "1e-5",
            "--lr-warmup-iters", "2", "--seed", "1234", "--eval-iters", "0", "--log-interval", "1"]


def run_training(argv: Sequence[str], pretrain: Callable) -> str:
    """The trainer's log of one single-process run of `argv` (our log lines only)."""
    captured = io.StringIO()
    handler = logging.StreamHandler(captured)
    ours = logging.getLogger("megatron")
    ours.addHandler(handler)
    ours.setLevel(logging.INFO)
    try:
        pretrain(list(argv))
    finally:
        ours.removeHandler(handler)
    return captured.getvalue()


def losses_of(log: str) -> List[float]:
    return [record.lm_loss for record in parse_log(log).iterations]


def max_relative_gap(curve: Sequence[float], reference: Sequence[float]) -> float:
    return max(abs(a - b) / abs(b) for a, b in zip(curve, reference))


def speed_row(shape, settings: str, flags: Sequence[str], iterations: int,
              train: Callable[[Sequence[str]], str], devices: int = 1,
              attention: Optional[Callable] = None) -> SpeedRow:
    """One grid cell on `devices` devices, trained by `train` (argv -> log) with `attention` (None: the device's
    own kernel; the planner's estimate follows it). A run that fails (out of device memory, a kernel the
    device lacks) becomes a row that says why, so one bad setting does not cost the rest of the report."""
    name, layers, hidden, heads, seq = shape
    argv = [*shape_flags(layers, hidden, heads, seq), *SHAPE_FLAGS.get(name, ()), *flags, "--train-iters",
            str(iterations)]
    planned = planned_memory(argv, devices, device.device_name(), fragmentation=0.0, attention=attention).total / GIB
    try:
        log = parse_log(train(argv))
    except TrainingFailed as failure:
        return SpeedRow(name, settings, planned_memory_gib=planned, failure=str(failure))
    timed = log.iterations[1:] or log.iterations  # the first logged window (warm-up, compilation) excluded
    samples = sum(r.samples_per_second for r in timed) / len(timed)
    mfus = [r.mfu for r in timed]
    return SpeedRow(name, settings, samples, samples * seq, sum(r.tflops for r in timed) / len(timed),
                    None if None in mfus else sum(mfus) / len(mfus), (log.peak_allocated_mb or 0.0) / 1024, planned)


class TrainingFailed(Exception):
    """A speed cell's training process failed; the message says why in a few words."""


# Set by torchrun, the deepspeed launcher or an earlier in-process run: a fresh process must form its own group.
_PROCESS_GROUP_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def train_in_fresh_process(argv: Sequence[str], nproc: int = 1, keep: Optional[Callable[[str], None]] = None) -> str:
    """The log of `pretrain_gpt.py argv` run as its own process (`nproc` > 1: that many under torchrun, one per
    device, as a real job runs): one cell's memory (or its running out of it) and compiled kernels cannot touch
    the next. `keep`, if given, receives the command and its whole output, whether or not it succeeded."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "pretrain_gpt.py")
    environment = {key: value for key, value in os.environ.items() if key not in _PROCESS_GROUP_VARIABLES}
    launcher = [] if nproc == 1 else ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    done = subprocess.run([sys.executable, *launcher, script, *argv], capture_output=True, text=True,
                          env=environment)
    output = done.stdout + done.stderr
    if keep is not None:
        keep(f"$ pretrain_gpt.py {' '.join(argv)}  (processes: {nproc}, exit status {done.returncode})\n{output}")
    if done.returncode == 0:
        return output
    if "out of memory" in output.lower():
        raise TrainingFailed("out of device memory")
    errors = [line.strip() for line in output.splitlines() if line.strip().startswith("error:")]
    last = errors[:1] or [line.strip() for line in output.splitlines() if line.strip()][-1:] or [
        f"exit status {done.returncode}"]
    raise TrainingFailed(last[0][:160])


@dataclass(frozen=True)
class Layout:
    """A parallel layout of the whole-node check: tensor x pipeline x data parallel sizes."""
    tensor: int
    pipeline: int
    data: int

    @property
    def devices(self) -> int:
        return self.tensor * self.pipeline * self.data

    @property
    def name(self) -> str:
        sizes = (("TP", self.tensor), ("PP", self.pipeline), ("DP", self.data))
        return "x".join(f"{axis}{size}" for axis, size in sizes if size > 1) or "one device"

    def flags(self) -> List[str]:
        return ["--tensor-model-parallel-size", str(self.tensor), "--pipeline-model-parallel-size",
                str(self.pipeline)]


NODE_LAYOUTS = (Layout(1, 1, 2), Layout(2, 1, 1), Layout(1, 2, 1), Layout(2, 2, 2))
LAYOUT_GLOBAL_BATCH = 8  # every layout's micro-batches add up to the same global batch, so the losses compare


def node_layouts(nproc: int) -> List[Layout]:
    """The layouts of NODE_LAYOUTS that `nproc` devices can run."""
    return [layout for layout in NODE_LAYOUTS if layout.devices <= nproc]


def check_layouts(shape, nproc: int, on_accelerator: bool, iterations: int, say: Callable[[str], None]) -> None:
    """Each layout `nproc` devices allow, trained in fp32 on its own devices (torchrun), against one device: the
    same global batch, so the loss curves must agree to rounding."""
    # The vocabulary padded alike at TP 1 and 2 (64 x TP divides 50304): the same model at every layout.
    base = [*shape_flags(*shape[1:]), "--micro-batch-size", "2", "--global-batch-size", str(LAYOUT_GLOBAL_BATCH),
            "--train-iters", str(iterations), "--zero-stage", "1", "--make-vocab-size-divisible-by", "64"]
    reference = losses_of(train_in_fresh_process([*base, *Layout(1, 1, 1).flags()]))
    for layout in node_layouts(nproc):
        try:
            curve = losses_of(train_in_fresh_process([*base, *layout.flags()], layout.devices))
        except TrainingFailed as failure:
            say(f"[{shape[0]}] {layout.name} on {layout.devices} devices: failed, {failure}")
            continue
        say(f"[{shape[0]}] {layout.name} on {layout.devices} devices vs one, fp32: max relative loss gap "
            f"{max_relative_gap(curve, reference):.2e}")


# Speed grid cells per shape: (micro batch, recompute, ZeRO stage, torch.compile, pipeline engine). Each shape's
# fastest eager cell is also run under --torch-compile, so one run settles whether compiling is faster (its
# default). tools/device_run.sh sizes the run to the time of one device session (docs/benchmarks.md); 1.3B at
# micro batch 16 without recomputation does not fit 80 GB. MoE runs on the plain engine only, and only when named.
SPEED_GRIDS = {
    "345M": ((16, False, 1, False, False), (32, False, 1, False, False), (32, False, 1, True, False)),
    "1.3B": ((8, False, 1, False, False), (8, False, 1, True, False)),
    "toy": ((2, False, 1, False, False), (2, True, 1, False, False)),
    "345M-MoE8": ((8, False, 1, False, False), (16, True, 1, False, False)),
    "toy-MoE4": ((2, False, 1, False, False),),
}
NAMED_ONLY = ("345M-MoE8",)  # left out of an accelerator run that names no --shapes


# What a speed cell measures on an accelerator: what users run, a global batch of about 0.5 M tokens (512 x 1024)
# reached by gradient accumulation, so the optimizer and DeepSpeed's per-step work are amortised as in a real job,
# logged every 10 iterations unless the run says otherwise (the first window, warm-up and compilation, is not
# timed). On the CPU: one micro-batch per step, every iteration logged, so that CI runs the same code quickly.
GLOBAL_BATCH_TOKENS = 512 * 1024
SPEED_LOG_INTERVAL = 10


def speed_grid(shape_name: str, on_accelerator: bool, seq: int = 1024,
               log_interval: int = SPEED_LOG_INTERVAL, compiles: bool = True, bf16: bool = True) -> List[tuple]:
    """(label, flags) of the settings tried for a shape, with torch's fused AdamW throughout; an accelerator's
    cells log every `log_interval` iterations, in bf16 where it has bf16 (`bf16`), else in fp32. Without
    `compiles` (no inductor backend for the device) the torch.compile cells are left out."""
    grid = []
    for micro, recompute, zero, compiled, pipelined in SPEED_GRIDS[shape_name]:
        if compiled and not compiles:
            continue
        global_batch = max(micro, GLOBAL_BATCH_TOKENS // seq // micro * micro) if on_accelerator else micro
        label = (f"mbs {micro}, {'recompute' if recompute else 'no recompute'}, ZeRO {zero}"
                 f"{', torch.compile' if compiled else ''}{', pipeline engine' if pipelined else ''}")
        flags = [*(["--bf16"] if on_accelerator and bf16 else []), "--micro-batch-size", str(micro), "--zero-stage", str(zero),
                 "--global-batch-size", str(global_batch),
                 "--log-interval", str(log_interval if on_accelerator else 1),
                 *([] if pipelined else ["--no-pipeline-parallel"]),
                 *(["--checkpoint-activations"] if recompute else []), *(["--torch-compile"] if compiled else [])]
        grid.append((label, flags))
    return grid


CHECKS = ("correctness", "speed")


def report(on_accelerator: bool, pretrain: Callable, iterations: int, say: Callable[[str], None],
           attention: Callable = sdpa_attention, checks: Sequence[str] = CHECKS,
           shapes: Optional[Sequence[str]] = None, nproc: int = 1, log_interval: int = SPEED_LOG_INTERVAL,
           keep_log: Optional[Callable[[str], None]] = None) -> List[SpeedRow]:
    """Run the `checks` (correctness, speed) on the `shapes` (by name; None = all), saying each result as it
    comes; returns the speed rows (best first per shape). `attention` is the kernel training uses on this device
    (select_kernels'). With `nproc` > 1 devices, correctness also compares each parallel layout they allow with
    one device, and the speed grid's first cell runs at each of those layouts. Speed cells log every
    `log_interval` iterations on an accelerator; `keep_log` receives each speed cell's whole output."""
    speed_candidates = ACCELERATOR_SHAPES if on_accelerator else CPU_SHAPES
    correctness_candidates = CORRECTNESS_SHAPES_ACCELERATOR if on_accelerator else CORRECTNESS_SHAPES_CPU
    known = {shape[0] for shape in (*speed_candidates, *correctness_candidates)}
    if shapes is not None and not set(shapes) <= known:
        raise InputError(f"--shapes {','.join(shapes)}: {', '.join(sorted(set(shapes) - known))} unknown here; "
                         f"choose from {', '.join(sorted(known))}")

    def chosen(candidates):
        return [shape for shape in candidates
                if (shape[0] not in NAMED_ONLY if shapes is None else shape[0] in shapes)]

    say(f"device: {device.device_model_name()} ({device.device_name()}), {nproc} used")
    compile_missing = device.compile_unavailable() if "speed" in checks else None
    if compile_missing:
        say(f"torch.compile cells left out: {compile_missing}")
    halves = half_precisions(on_accelerator)
    bf16 = "--bf16" in halves
    speed_shapes = chosen(speed_candidates)
    for name, layers, hidden, heads, seq in speed_shapes:
        say(f"[{name}] attention kernel, causal {'bf16' if bf16 else 'fp32'}: "
            f"{attention_kernel(attention, heads, seq, hidden // heads, torch.bfloat16 if bf16 else torch.float32)}")
    if "correctness" in checks:
        train = correctness_training(pretrain, nproc)
        for shape in chosen(correctness_candidates):
            check_correctness(shape, on_accelerator, train, iterations, say, halves)
            if nproc > 1:
                check_layouts(shape, nproc, on_accelerator, iterations, say)
    rows = []
    if "speed" in checks:
        for shape in speed_shapes:
            train = functools.partial(train_in_fresh_process, keep=keep_log)
            shape_rows = [speed_row(shape, label, flags, iterations, train, attention=attention)
                          for label, flags in speed_grid(shape[0], on_accelerator, shape[4], log_interval,
                                                         compile_missing is None, bf16)]
            shape_rows += layout_speed_rows(shape, nproc, on_accelerator, iterations, log_interval, keep_log, bf16,
                                            attention)
            rows += sorted(shape_rows, key=lambda row: -row.samples_per_second)
        say(speed_table(rows, allocator_peaks=on_accelerator))
    return rows


def layout_speed_rows(shape, nproc: int, on_accelerator: bool, iterations: int,
                      log_interval: int = SPEED_LOG_INTERVAL,
                      keep_log: Optional[Callable[[str], None]] = None, bf16: bool = True,
                      attention: Optional[Callable] = None) -> List[SpeedRow]:
    """The shape's first grid cell at each layout `nproc` devices allow (samples/s of the whole job; memory and
    the planner's estimate per device, training with `attention` as speed_row)."""
    label, flags = speed_grid(shape[0], on_accelerator, shape[4], log_interval, bf16=bf16)[0]
    rows = []
    for layout in node_layouts(nproc):
        engine = [flag for flag in flags if flag != "--no-pipeline-parallel" or layout.pipeline == 1]
        step = int(flags[flags.index("--micro-batch-size") + 1]) * layout.data  # samples of one accumulation step
        global_batch = max(step, int(flags[flags.index("--global-batch-size") + 1]) // step * step)
        cell_flags = [*engine, *layout.flags(), "--global-batch-size", str(global_batch)]
        rows.append(speed_row(shape, f"{label}, {layout.name} on {layout.devices} devices", cell_flags, iterations,
                              functools.partial(train_in_fresh_process, nproc=layout.devices, keep=keep_log),
                              layout.devices, attention))
    return rows


def correctness_training(pretrain: Callable, nproc: int) -> Callable[[Sequence[str]], str]:
    """How the correctness checks train (argv -> log): in this process when it checks one device; with `nproc` > 1
    each run in a fresh process, so that this one holds no engine, process group or cached memory on device 0
    while the layout checks' processes use devices 0..N-1."""
    if nproc == 1:
        return functools.partial(run_training, pretrain=pretrain)
    return train_in_fresh_process


def half_precisions(on_accelerator: bool) -> List[str]:
    """The half-precision flags this device trains in: on an accelerator bf16 where it has it and fp16 where an
    overflow shows as inf/NaN (neither on a first-generation Ascend 910), on the CPU bf16."""
    if not on_accelerator:
        return ["--bf16"]
    return [flag for flag, works in (("--bf16", device.bf16_supported()), ("--fp16", device.fp16_overflow_visible()))
            if works]


def check_correctness(shape, on_accelerator: bool, train: Callable[[Sequence[str]], str], iterations: int,
                      say: Callable[[str], None], halves: Sequence[str] = ("--bf16",)) -> None:
    """fp32 against the CPU, recomputation against none, and each half precision of `halves` against the fp32
    curve; `train` runs one training (argv -> log)."""
    if on_accelerator:
        say(f"[{shape[0]}] fp32 logits/loss vs CPU: max relative difference {logits_match_cpu(*shape):.2e}")
    base = [*shape_flags(*shape[1:]), "--micro-batch-size", "2", "--train-iters", str(iterations),
            "--no-pipeline-parallel", "--zero-stage", "1"]
    reference = losses_of(train(base))
    recomputed = losses_of(train([*base, "--checkpoint-activations"]))
    say(f"[{shape[0]}] recompute vs none, fp32: max relative loss gap {max_relative_gap(recomputed, reference):.2e}")
    for dtype in halves:
        curve = losses_of(train([*base, dtype]))
        say(f"[{shape[0]}] {dtype[2:]} vs fp32 over {iterations} iterations: max relative loss gap "
            f"{max_relative_gap(curve, reference):.2e}; final loss {curve[-1]:.4f} vs {reference[-1]:.4f}")


def speed_table(rows: Sequence[SpeedRow], allocator_peaks: bool = True) -> str:
    """Markdown table of the rows, the fastest finished row of each shape marked best. With `allocator_peaks`
    (an accelerator's: allocated bytes, as the planner counts them) the planner's estimate is also given as its
    error against the measured peak; a CPU's peak is the process's resident memory, not comparable."""
    lines = ["| shape | settings | samples/s | tokens/s | TFLOPs | MFU | peak memory (GiB) | planner (GiB, vs peak) |",
             "|---|---|---|---|---|---|---|---|"]
    best = {}
    for row in rows:
        if row.failure is None:
            best.setdefault(row.shape, row)
    for row in rows:
        planned = "-" if row.planned_memory_gib is None else f"{row.planned_memory_gib:.2f}"
        if row.failure is not None:
            lines.append(f"| {row.shape} | {row.settings}: failed, {row.failure} | - | - | - | - | - | {planned} |")
            continue
        if allocator_peaks and row.planned_memory_gib is not None and row.peak_memory_gib > 0:
            planned += f" ({(row.planned_memory_gib - row.peak_memory_gib) / row.peak_memory_gib:+.1%})"
        mark = " **best**" if best[row.shape] is row else ""
        lines.append(f"| {row.shape} | {row.settings}{mark} | {row.samples_per_second:.2f} | "
                     f"{row.tokens_per_second:.0f} | {row.tflops:.3g} | {format_mfu(row.mfu)} | "
                     f"{row.peak_memory_gib:.2f} | {planned} |")
    return "\n".join(lines)
