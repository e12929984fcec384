"""What test/train_full_8p.sh and test/train_performance_8p.sh do: pick the device, the preset and the data,
launch one pretrain_gpt.py process per device with torchrun, keep the log under test/output/<run>/, and end
with the three summary lines of docs/ARCHITECTURE.md, Log lines.

  launch_training.py --run full|performance [--model_size=tiny] [--data_path=DIR_OR_PREFIX] [--train_iters=N]
      [--device=auto|cuda|npu|cpu] [--nproc=N] [--ds_sequence_parallel_size=N]
      [--nnodes=N --node_rank=I --master_addr=HOST --master_port=P]
      [--vocab_file=F --merge_file=F | --tokenizer_model=F] [--output_dir=DIR] [--skip_memory_check]
      [Megatron flags passed through, e.g. --zero-stage 1]

--output_dir=DIR fixes the run directory (default: a new test/output/<run name>/ per run). A full run saves its
checkpoints in DIR/checkpoints; the same command again resumes from the newest complete one there.

Before starting, it prints the layout planner's memory estimate per device (megatron/planning) and, on an
accelerator, refuses a layout that cannot fit one, naming the largest term (--skip_memory_check starts anyway).

One node without --master_port lets torchrun pick a free port (its --standalone mode), so jobs that share a
machine do not collide on 29500. Several nodes: every node runs the same command with its --node_rank; the last
node holds the logging rank (the last global rank), so it writes train.log and run.json and prints the summary;
the others keep their output in train.node<I>.log of the same run directory and say which node has the summary.
"""
import argparse
import glob
import json
import math
import os
import platform
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from typing import Optional

TOOLS = os.path.dirname(os.path.abspath(__file__))
MEGATRON_ROOT = os.path.dirname(TOOLS)
REPO_ROOT = os.path.dirname(MEGATRON_ROOT)

from megatron.device_probe import CPU_FACTS, DeviceFacts, probe_device_facts
from megatron.errors import InputError, RunError, run_cli
from megatron.files.atomic import write_text_atomically
from megatron.launched_rank import end_with_parent
from megatron.reports.job_output import FirstFailure

DEVICES = ("auto", "cuda", "npu", "cpu")
DEFAULT_TIMEOUT_MINUTES = 60.0
VOCAB_NAMES = ("gpt2-vocab.json", "vocab.json")
MERGES_NAMES = ("gpt2-merges.txt", "merges.txt")
MULTI_NODE_PORT = 29500  # torchrun's default: every node must name the same port


def positive_int(flag):
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag}={text!r} is not a whole number") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{flag}={value} must be at least 1")
        return value
    return parse


def build_parser() -> argparse.ArgumentParser:
    """The entry scripts' own options (the flag reference is generated from this parser)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("--run", choices=("full", "performance"), required=True)
    parser.add_argument("--model_size", help="a --model-size preset (docs/training.md, Presets; a wrong name is "
                                             "answered with the list; default: tiny on CPU, 345M on accelerators)")
    parser.add_argument("--data_path", help="a .bin/.idx prefix, or a directory holding one dataset and its "
                                            "vocab files (default: the embedded demo data, built if absent)")
    parser.add_argument("--train_iters", type=positive_int("--train_iters"))
    parser.add_argument("--device", choices=DEVICES, default="auto")
    parser.add_argument("--nproc", type=positive_int("--nproc"), help="processes on this node (default: one "
                        "per accelerator; on CPU TP x PP x SP x 2)")
    parser.add_argument("--ds_sequence_parallel_size", "--ds-sequence-parallel-size",
                        type=positive_int("--ds_sequence_parallel_size"), default=1,
                        help="DeepSpeed-Ulysses: ranks sharing each sequence (pretrain_gpt.py's "
                             "--ds-sequence-parallel-size; with --tensor-model-parallel-size 1 "
                             "--pipeline-model-parallel-size 1 --no-pipeline-parallel). World = TP x PP x DP x this")
    parser.add_argument("--nnodes", type=positive_int("--nnodes"), default=1)
    parser.add_argument("--node_rank", type=int, default=0)
    parser.add_argument("--master_addr", default="127.0.0.1")
    parser.add_argument("--master_port", type=positive_int("--master_port"),
                        help=f"default: a free port on one node, {MULTI_NODE_PORT} on several")
    parser.add_argument("--vocab_file")
    parser.add_argument("--merge_file")
    parser.add_argument("--tokenizer_model")
    parser.add_argument("--skip_memory_check", action="store_true",
                        help="start even when the layout planner's estimate exceeds a device's memory")
    parser.add_argument("--output_dir", help="the run directory (default: a new one under test/output/); a full "
                                             "run started again with the same one resumes from its checkpoints")
    return parser


def parse_args(argv):
    parser = build_parser()
    args, passthrough = parser.parse_known_args(argv)
    unknown = [arg for arg in passthrough if arg.startswith("--") and "_" in arg.split("=")[0]
               and arg.split("=")[0] != "--deepspeed_config"]
    if unknown:
        parser.error(f"unknown option {unknown[0]}: script options are spelled with underscores (see --help), "
                     f"Megatron flags passed through with dashes")
    return args, passthrough


def detect_device(requested: str) -> DeviceFacts:
    """This node's accelerator facts (NPU when torch_npu and devices are present, else CUDA, else CPU), asked in a
    child process (megatron/device_probe.py) so that the launcher holds no device for the length of the run."""
    if requested == "cpu":
        os.environ["DS_ACCELERATOR"] = "cpu"
        return CPU_FACTS  # nothing to ask
    if requested in ("cuda", "npu"):
        os.environ["DS_ACCELERATOR"] = requested
    facts = probe_device_facts(os.path.join(TOOLS, "device_facts.py"))
    if requested != "auto" and facts.name != requested:
        raise InputError(f"--device={requested} was asked for, but DeepSpeed found '{facts.name}' here; check the "
                         f"drivers (and for npu: source test/env_npu.sh), or use --device=auto")
    if facts.name != "cpu" and facts.count == 0:
        raise InputError(f"--device={requested}: DeepSpeed selected '{facts.name}' but sees no {facts.name} device "
                         f"here; check the drivers and CUDA_VISIBLE_DEVICES / ASCEND_RT_VISIBLE_DEVICES, or use "
                         f"--device=cpu")
    return facts


def precision_flags(facts: DeviceFacts, passthrough: list[str]) -> tuple[list[str], str]:
    """(flags, the line that says which precision and why). On an accelerator: --bf16 where the device itself
    says it has bf16 (tensor-core bf16 with fp32 master weights), else --fp16 with dynamic loss scaling where an
    fp16 overflow is visible to it, else fp32; unless the user chose a precision with --fp16, --bf16 or a
    --deepspeed_config (whose fp16 / bf16 sections decide). CPU runs stay fp32 unless asked."""
    chosen = {"--fp16", "--bf16", "--deepspeed_config", "--deepscale_config"}
    given = [arg.split("=")[0] for arg in passthrough if arg.split("=")[0] in chosen]
    if given:
        return [], f"precision: as {given[0]} says"
    if facts.name == "cpu":
        return [], "precision: fp32 (the CPU default; --bf16 to change it)"
    if facts.bf16:
        return ["--bf16"], f"precision: bf16 (this {facts.name} reports bf16 support)"
    if facts.fp16_overflow_visible:
        return ["--fp16"], f"precision: fp16 with dynamic loss scaling (this {facts.name} reports no bf16 support)"
    return [], (f"precision: fp32 (this {facts.name} reports no bf16 support, and its fp16 saturates on overflow "
                "instead of producing inf/NaN, which loss scaling needs to see); on NPUs below Ascend910B1 torch_npu's "
                "precision mode allow_fp32_to_fp16 still runs matmuls in fp16, where they saturate too")


def timeout_flags(passthrough: list[str]) -> tuple[list[str], float]:
    """(flags, minutes): --distributed-timeout-minutes as given, else DEFAULT_TIMEOUT_MINUTES, long enough for the
    other ranks to wait while rank 0 builds a large dataset's index cache. HCCL's timeouts derive from it."""
    for index, arg in enumerate(passthrough):
        name, _, value = arg.partition("=")
        if name == "--distributed-timeout-minutes":
            value = value or (passthrough[index + 1] if index + 1 < len(passthrough) else "")
            try:
                return [], float(value)
            except ValueError:
                raise InputError(f"--distributed-timeout-minutes {value!r} is not a number of minutes") from None
    return ["--distributed-timeout-minutes", f"{DEFAULT_TIMEOUT_MINUTES:g}"], DEFAULT_TIMEOUT_MINUTES


def wandb_flags(passthrough: list[str], run_dir: str) -> list[str]:
    """W&B's files beside the run's TensorBoard events (<run>/wandb) when a --wandb-project or --wandb-exp-name is
    passed without a --wandb-save-dir: a performance run has no --save for the trainer's default."""
    names = {arg.split("=")[0] for arg in passthrough}
    if names & {"--wandb-project", "--wandb-exp-name"} and "--wandb-save-dir" not in names:
        return ["--wandb-save-dir", os.path.join(run_dir, "wandb")]
    return []


def demo_data() -> tuple[str, str, str]:
    prefix = os.path.join(REPO_ROOT, "data", "demo_text_document")
    tokenizer = os.path.join(REPO_ROOT, "data", "demo_tokenizer")
    if not os.path.exists(prefix + ".idx"):
        print("Building the demo data (test/dataset_preprocess_gpt.sh) ...", flush=True)
        subprocess.run(["bash", os.path.join(REPO_ROOT, "test", "dataset_preprocess_gpt.sh")], check=True)
    return prefix, os.path.join(tokenizer, "vocab.json"), os.path.join(tokenizer, "merges.txt")


def _find(directory, names):
    return next((os.path.join(directory, n) for n in names if os.path.isfile(os.path.join(directory, n))), None)


def resolve_data(args) -> tuple[str, list[str]]:
    """The --data-path prefix and the tokenizer flags for pretrain_gpt.py."""
    make_data = "make data with: bash test/dataset_preprocess_gpt.sh --input=corpus.jsonl --vocab_file=... " \
                "--merge_file=..."
    if args.data_path is None:
        prefix, vocab, merges = demo_data()
    else:
        path = os.path.abspath(args.data_path)
        vocab, merges = args.vocab_file, args.merge_file
        if os.path.isdir(path):
            indexes = sorted(glob.glob(os.path.join(path, "*_document.idx")) + glob.glob(os.path.join(path, "*_sentence.idx")))
            if len(indexes) != 1:
                raise InputError(f"--data_path={args.data_path} is a directory with {len(indexes)} datasets "
                                 f"(*_document.idx); give the prefix of one, e.g. {path}/my-gpt2_text_document, "
                                 f"or {make_data}")
            prefix = indexes[0][:-len(".idx")]
            vocab, merges = vocab or _find(path, VOCAB_NAMES), merges or _find(path, MERGES_NAMES)
        else:
            prefix = path
            if not (os.path.isfile(prefix + ".idx") and os.path.isfile(prefix + ".bin")):
                raise InputError(f"--data_path={args.data_path}: no {prefix}.bin/.idx; {make_data}")
    if args.tokenizer_model:
        return prefix, ["--tokenizer-type", "GPTSentencePieceTokenizer", "--tokenizer-model", args.tokenizer_model]
    if not vocab or not merges:
        raise InputError(f"--data_path={args.data_path}: no GPT-2 vocab/merges found beside the data "
                         f"({' or '.join(VOCAB_NAMES)}, {' or '.join(MERGES_NAMES)}); give --vocab_file and "
                         f"--merge_file, or --tokenizer_model for SentencePiece")
    return prefix, ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", vocab, "--merge-file", merges]


def model_shape(pretrain_flags: list[str], world_size: int, device_name: str) -> tuple[dict, object, int]:
    """The shape figures of the results table, as pretrain_gpt.py will see them (preset plus user flags), with
    the validated flags and the tokenizer's vocabulary size; a flag pretrain_gpt.py would reject is reported now,
    once, before any process starts."""
    from megatron.config.arguments import parse_args as parse_pretrain_args
    from megatron.config.arguments import validate_args
    from megatron.tokenizer import build_tokenizer, vocab_size_with_padding

    flags = validate_args(parse_pretrain_args(pretrain_flags), world_size, device_name)
    tokenizer = build_tokenizer(flags.tokenizer_type, vocab_file=flags.vocab_file, merge_file=flags.merge_file,
                                tokenizer_model=flags.tokenizer_model, vocab_size=flags.vocab_size)
    shape = {"seq_length": flags.seq_length, "num_layers": flags.num_layers, "hidden_size": flags.hidden_size,
             "padded_vocab_size": vocab_size_with_padding(tokenizer.vocab_size, flags.make_vocab_size_divisible_by,
                                                          flags.tensor_model_parallel_size),
             "train_iters": flags.train_iters, "global_batch_size": flags.global_batch_size}
    return shape, flags, tokenizer.vocab_size


def check_memory(flags, vocab_size: int, capacity: Optional[int], skip: bool, kv_repeated: bool = True) -> None:
    """Print the layout planner's memory estimate for this job's layout; refuse it when it cannot fit a device
    of `capacity` bytes (None: unknown, as on the CPU) unless `skip`. `kv_repeated`: the device's attention kernel
    gets grouped K/V repeated (DeviceFacts.kv_repeated)."""
    from megatron.planning.memory import estimate_memory
    from megatron.planning.search import describe, require_fit
    from megatron.planning.shape import from_flags

    shape, layout, settings = from_flags(flags, vocab_size)
    memory = estimate_memory(shape, layout, replace(settings, kv_repeated=kv_repeated))
    print(f"Memory estimate (tools/plan_layout.py): {describe(memory)}"
          + ("" if capacity is None else f"; a device has {capacity / (1 << 30):.1f} GiB"), flush=True)
    if capacity is not None and not skip:
        require_fit(memory, capacity, "--skip_memory_check")


def machine_description(device_name: str, nproc: int) -> str:
    if device_name != "cpu":
        return f"{nproc} x {device_name.upper()}"
    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
                 platform.machine()) if os.path.exists("/proc/cpuinfo") else platform.machine()
    return f"{os.cpu_count()}-core {model}"


def schedule_flags(run: str, train_iters: int) -> list[str]:
    """How often to log, evaluate and save: Megatron's usual intervals, shrunk for short runs."""
    log_interval = 1 if run == "performance" else max(1, min(100, train_iters // 30))
    eval_interval = max(1, min(1000, train_iters // 3))
    flags = ["--log-interval", str(log_interval), "--eval-interval", str(eval_interval), "--eval-iters", "10"]
    if run == "full":
        flags += ["--save-interval", str(min(10000, train_iters))]
    return flags


def main(argv=None):
    args, passthrough = parse_args(argv)
    facts = detect_device(args.device)
    # Only now: these import torch (and torch.distributed, which loads torch_npu), whose failure on a broken
    # torch_npu / CANN the device child has just explained in one line.
    from megatron.config.presets import get_preset
    from megatron.parallel_state import hccl_environment
    from megatron.reports.results import TRAIN_LOG_FILE
    from megatron.training.log_lines import parse_log
    device_name, device_count = facts.name, facts.count
    model_size = args.model_size or ("tiny" if device_name == "cpu" else "345M")
    preset = get_preset(model_size, args.run)  # InputError listing the valid names
    train_iters = args.train_iters or preset["train_iters"]
    sizes = model_parallel_sizes(preset, passthrough, args.ds_sequence_parallel_size)
    model_parallel = math.prod(sizes.values())
    nproc = args.nproc or (device_count if device_name != "cpu" else 2 * model_parallel)
    if device_name != "cpu" and nproc > device_count:
        raise InputError(f"--nproc={nproc} but this node has {device_count} {device_name} devices")
    world_size = nproc * args.nnodes
    if world_size < model_parallel or world_size % model_parallel:
        named = " x ".join(f"{axis} {size}" for axis, size in sizes.items() if axis != "SP" or size > 1)
        raise InputError(f"--model_size={model_size} needs a multiple of {named} = {model_parallel} processes, but "
                         f"{world_size} are launched ({nproc} per node x {args.nnodes} nodes); add devices or pick "
                         f"a smaller --model_size")
    last_node = check_nodes(args)
    data_prefix, tokenizer_flags = resolve_data(args)

    run_name = f"{model_size}_{device_name}_{args.run}_{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir = os.path.abspath(args.output_dir or os.path.join(REPO_ROOT, "test", "output", run_name))
    precision, precision_line = precision_flags(facts, passthrough)
    print(precision_line, flush=True)
    timeout, timeout_minutes = timeout_flags(passthrough)
    ulysses = ["--ds-sequence-parallel-size", str(sizes["SP"])] if sizes["SP"] > 1 else []
    flags = ["--model-size", model_size, "--train-iters", str(train_iters), "--data-path", data_prefix, *ulysses,
             *tokenizer_flags, *schedule_flags(args.run, train_iters),
             "--tensorboard-dir", os.path.join(run_dir, "tensorboard"), *wandb_flags(passthrough, run_dir), *precision,
             *timeout]
    if args.run == "full":
        checkpoints = os.path.join(run_dir, "checkpoints")
        flags += ["--save", checkpoints, *resume_flags(checkpoints)]
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", *rendezvous_flags(args),
               os.path.join(MEGATRON_ROOT, "pretrain_gpt.py"), *flags, *passthrough]
    environment = dict(os.environ)
    if device_name == "npu":  # before the ranks start, in case CANN reads them before the process group exists
        environment.update(hccl_environment(timeout_minutes, environment))
    if device_name == "cpu":
        environment.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    shape, pretrain_flags, vocab_size = model_shape(flags + passthrough, world_size, device_name)
    check_memory(pretrain_flags, vocab_size, facts.total_memory, args.skip_memory_check, facts.kv_repeated)
    run_info = {"model_size": model_size, "device": device_name, "machine": machine_description(device_name, nproc),
                "run": args.run, "nproc_per_node": nproc, "nnodes": args.nnodes, "world_size": world_size,
                **shape, "command": shlex.join(command), "start_time": time.time()}
    os.makedirs(run_dir, exist_ok=True)  # only for a job whose flags passed
    logs_here = args.node_rank == last_node
    log_path = fresh_log_path(run_dir, TRAIN_LOG_FILE if logs_here else f"train.node{args.node_rank}.log")
    print(f"Run {run_name}: {world_size} {device_name} processes; log: {log_path}", flush=True)
    try:
        job = run_job(command, environment, log_path)
    except BaseException:  # Ctrl-C, or this process failing: the run directory still says how it ended
        if logs_here:
            write_run_info(run_dir, run_info, "interrupted (Ctrl-C)" if sys.exc_info()[0] is KeyboardInterrupt
                           else f"the launcher failed ({sys.exc_info()[1]!r})")
        raise
    with open(log_path, encoding="utf-8", errors="replace") as log:
        parsed = parse_log(log)
    # Forwarded SIGTERM: torchrun reports the signal it got, though the ranks saved and exited 0.
    succeeded = job.returncode == 0 or (job.terminated and parsed.stopped_on_request)
    if logs_here:
        write_run_info(run_dir, run_info, how_it_ended(job, parsed, succeeded))
        if succeeded or parsed.diverged_at is not None:
            summarize(run_dir)
    if not succeeded:
        raise RunError(f"{job.failure.message or f'training failed (exit {job.returncode})'} (log: {log_path})")
    if not logs_here:
        print(f"Node {args.node_rank} done. The summary is on node {last_node} (node_rank={last_node}), which holds "
              f"the logging rank {world_size - 1}: its output and run.json are in {run_dir}", flush=True)


def model_parallel_sizes(preset: dict, passthrough: list, ulysses: int) -> dict:
    """TP, PP and SP of the job: the preset's TP and PP unless pretrain_gpt.py flags passed through override them,
    and the DeepSpeed-Ulysses size; their product divides the world size."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--tensor-model-parallel-size", type=int, default=preset["tensor_model_parallel_size"])
    parser.add_argument("--pipeline-model-parallel-size", type=int, default=preset["pipeline_model_parallel_size"])
    given, _ = parser.parse_known_args(passthrough)
    return {"TP": given.tensor_model_parallel_size, "PP": given.pipeline_model_parallel_size, "SP": ulysses}


def check_nodes(args) -> int:
    """The node that holds the logging rank (the last global rank; torchrun numbers ranks node by node), once
    the multi-node flags are consistent."""
    if not 0 <= args.node_rank < args.nnodes:
        raise InputError(f"--node_rank={args.node_rank} must be between 0 and --nnodes - 1 = {args.nnodes - 1}")
    if args.nnodes > 1 and not args.output_dir:
        raise InputError(f"--nnodes={args.nnodes}: every node writes into one run directory; give "
                         f"--output_dir=DIR on a file system all nodes see (the same DIR on every node)")
    return args.nnodes - 1


def rendezvous_flags(args) -> list[str]:
    """torchrun's flags for where the ranks meet: one node without --master_port uses --standalone, where
    torchrun picks a free port; several nodes meet at --master_addr:--master_port."""
    if args.nnodes == 1 and args.master_port is None:
        return ["--standalone", "--nnodes=1"]
    return [f"--nnodes={args.nnodes}", f"--node_rank={args.node_rank}", f"--master_addr={args.master_addr}",
            f"--master_port={args.master_port or MULTI_NODE_PORT}"]


def summarize(run_dir: str):
    """The three summary lines (tools/summarize_run.py); its error line is already on the terminal."""
    result = subprocess.run([sys.executable, os.path.join(TOOLS, "summarize_run.py"), run_dir])
    if result.returncode != 0:
        raise RunError(f"the run ended, but its summary failed (exit {result.returncode}); run directory: {run_dir}")


def how_it_ended(job: "Job", parsed, succeeded: bool) -> str:
    """run.json's `ended`: completed, stopped on request, diverged, terminated, or failed with the first failing
    rank's line."""
    if parsed.diverged_at is not None:
        return f"diverged at iteration {parsed.diverged_at}"
    if succeeded:
        return "stopped on request (SIGTERM or --exit-duration-in-mins)" if parsed.stopped_on_request else "completed"
    if job.terminated:  # the ranks ended at once: no --exit-signal-handler to save first
        return "terminated (SIGTERM; with --exit-signal-handler a run saves a checkpoint before it stops)"
    return f"failed: {job.failure.message or f'exit status {job.returncode}'}"


def write_run_info(run_dir: str, run_info: dict, ended: str) -> None:
    write_text_atomically(os.path.join(run_dir, "run.json"),
                          json.dumps({**run_info, "end_time": time.time(), "ended": ended}, indent=2))


def resume_flags(checkpoints: str) -> list[str]:
    """--load of the newest complete checkpoint in `checkpoints` (the one its `latest` names), said aloud; none
    when there is none yet."""
    from megatron.checkpoint.trainer.guard import latest_tag  # here: it imports torch, after detect_device chose one
    tag = latest_tag(checkpoints) if os.path.isdir(checkpoints) else None  # the pointer read as training reads it
    if tag is None:
        return []
    print(f"Resuming from {os.path.join(checkpoints, tag)} (the newest complete checkpoint in {checkpoints})",
          flush=True)
    return ["--load", checkpoints]


def fresh_log_path(run_dir: str, name: str) -> str:
    """The log `name` of this launch; an earlier launch's log in the same run directory is kept beside it."""
    path = os.path.join(run_dir, name)
    if os.path.exists(path):
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(os.path.getmtime(path)))
        os.replace(path, os.path.join(run_dir, f"{name[:-len('.log')]}.{stamp}.log"))
    return path


@dataclass
class Job:
    returncode: int
    failure: FirstFailure
    terminated: bool = False  # SIGTERM arrived and was passed on


def run_job(command, environment, log_path) -> Job:
    """Run the job: every line to the log, and to the terminal until the first rank fails
    (megatron/reports/job_output.py). torchrun runs in a process group of its own, so a signal reaches the job
    through this process only, once: SIGTERM, SIGINT (Ctrl-C, or `kill -INT` of this process alone) and SIGHUP
    are passed on to torchrun, which passes them to the ranks (SIGTERM with --exit-signal-handler saves a
    checkpoint first); an interrupted job then ends this process as Ctrl-C does. torchrun ends when this process
    ends, even by SIGKILL, and its ranks with it (megatron/launched_rank.py)."""
    job, interrupted = Job(0, FirstFailure()), []

    def pass_on(signum, frame):
        if signum == signal.SIGTERM:
            job.terminated = True
        else:
            interrupted.append(signum)
        process.send_signal(signum)

    with open(log_path, "w") as log, subprocess.Popen(command, env=environment, stdout=subprocess.PIPE,
                                                      stderr=subprocess.STDOUT, text=True, bufsize=1,
                                                      start_new_session=True, preexec_fn=end_with_parent) as process:
        for passed_on in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(passed_on, pass_on)
        for line in process.stdout:
            log.write(line)
            if job.failure.show(line):
                sys.stdout.write(line)
        job.returncode = process.wait()
    if interrupted:
        raise KeyboardInterrupt
    return job


if __name__ == "__main__":
    run_cli(main)
