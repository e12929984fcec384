"""What test/finetune_llama_8p.sh does: a Hugging Face model in, fine-tuned with finetune_llama.py on prompt/answer
rows over one process per device (CPU: TP x PP x 2 processes), a Hugging Face model out. On a CPU without
--hf_model it builds the demo (megatron/data/sft_demo.py: a tiny Llama and Alpaca rows from the standard library's
docstrings, no download). The run directory (test/output/<run>/) gets the import, train.log, run.json, the
checkpoints, loss_curve.png and hf/ (the export); the script ends with the three summary lines and a results line.

  launch_finetune.py [--hf_model=DIR] [--data_path=ROWS_OR_PREFIX] [--tp=2 --pp=2] [--train_iters=N] [--nproc=N]
      [--seq_length=256] [--micro_batch_size=2] [--global_batch_size=8] [--device=auto|cuda|npu|cpu]
      [--output_dir=DIR] [finetune_llama.py flags passed through, e.g. --lr 1e-5 --pack-sequences]
"""
import argparse
import importlib.util
import json
import os
import shlex
import sys
import time

from megatron.hf.conversions import export_hf, import_hf
from megatron.hf.directory import read_hf_model
from megatron.checkpoint.reshape.target_writer import TargetLayout
from megatron.config.arguments import model_flag_argv
from megatron.data.sft_demo import demo_rows, write_demo_llama
from megatron.errors import InputError, RunError, run_cli
from megatron.reports.results import TRAIN_LOG_FILE
from megatron.training.log_lines import parse_log


def _sibling(name: str):
    """A command line beside this one, loaded from its file: run as a script, this file's folder is on the path
    but the package root is not; imported by the tests, the reverse."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                     f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


launch = _sibling("launch_training")  # the pre-training entry scripts' device, precision, job and summary steps
DEMO_DIRECTORY = os.path.join(launch.REPO_ROOT, "data", "sft_demo")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("--hf_model", help="a local Hugging Face Llama or GPT-2 directory (default on CPU: the demo)")
    parser.add_argument("--data_path", help="rows (.json / .jsonl) or tools/preprocess_sft_data.py's prefix "
                                            "(default on CPU: the demo's Alpaca rows)")
    parser.add_argument("--tp", type=launch.positive_int("--tp"), default=2)
    parser.add_argument("--pp", type=launch.positive_int("--pp"), default=2)
    parser.add_argument("--train_iters", type=launch.positive_int("--train_iters"), default=50)
    parser.add_argument("--seq_length", type=launch.positive_int("--seq_length"), default=256)
    parser.add_argument("--micro_batch_size", type=launch.positive_int("--micro_batch_size"), default=2)
    parser.add_argument("--global_batch_size", type=launch.positive_int("--global_batch_size"), default=8)
    parser.add_argument("--nproc", type=launch.positive_int("--nproc"),
                        help="processes (default: one per accelerator; on CPU TP x PP x 2)")
    parser.add_argument("--device", choices=launch.DEVICES, default="auto")
    parser.add_argument("--output_dir", help="the run directory (default: a new one under test/output/)")
    return parser.parse_known_args(argv)


def demo_inputs(seq_length: int) -> tuple[str, str]:
    """The demo's Llama and rows, made once under data/sft_demo/."""
    model_dir, rows = os.path.join(DEMO_DIRECTORY, "llama"), os.path.join(DEMO_DIRECTORY, "alpaca_data.json")
    if not os.path.isfile(os.path.join(model_dir, "config.json")):
        print(f"building the demo Llama in {model_dir} (once)", flush=True)
        write_demo_llama(model_dir, seq_length=seq_length)
    if not os.path.isfile(rows):
        with open(rows + ".tmp", "w") as handle:
            json.dump(demo_rows(512), handle)
        os.replace(rows + ".tmp", rows)
    return model_dir, rows


def main(argv=None):
    args, passthrough = parse_args(argv)
    facts = launch.detect_device(args.device)
    if (args.hf_model is None or args.data_path is None) and facts.name != "cpu":
        raise InputError("--hf_model and --data_path: the demo is for CPUs; give a Hugging Face model directory and "
                         "the rows to fine-tune on")
    demo_model, demo_data = demo_inputs(args.seq_length) if None in (args.hf_model, args.data_path) else (None, None)
    hf_model, data_path = args.hf_model or demo_model, args.data_path or demo_data
    nproc = args.nproc or (facts.count if facts.name != "cpu" else 2 * args.tp * args.pp)
    run_name = f"finetune_{facts.name}_{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir = os.path.abspath(args.output_dir or os.path.join(launch.REPO_ROOT, "test", "output", run_name))
    imported, checkpoints = os.path.join(run_dir, "imported"), os.path.join(run_dir, "checkpoints")
    model = read_hf_model(hf_model).model_config
    precision, precision_line = launch.precision_flags(facts, passthrough)
    print(precision_line, flush=True)
    flags = [*model_flag_argv(model), "--load", imported, "--finetune", "--data-path", data_path,
             "--tokenizer-type", "HFTokenizer", "--tokenizer-model", hf_model, "--make-vocab-size-divisible-by", "1",
             "--tensor-model-parallel-size", str(args.tp), "--pipeline-model-parallel-size", str(args.pp),
             "--seq-length", str(args.seq_length), "--micro-batch-size", str(args.micro_batch_size),
             "--global-batch-size", str(args.global_batch_size), "--train-iters", str(args.train_iters),
             "--lr", "2e-5", "--lr-decay-style", "cosine", "--split", "100,0,0", "--eval-iters", "0",
             "--log-interval", "1", "--attention-dropout", "0", "--hidden-dropout", "0", "--num-workers", "0",
             "--save", checkpoints, "--save-interval", str(args.train_iters), *precision]
    shape, _, _ = launch.model_shape(flags + passthrough, nproc, facts.name)
    os.makedirs(run_dir, exist_ok=True)
    if not os.path.isdir(imported):
        print(f"importing {hf_model} at TP {args.tp} x PP {args.pp}", flush=True)
        import_hf(hf_model, imported, TargetLayout(args.tp, args.pp), make_vocab_size_divisible_by=1)
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--standalone",
               os.path.join(launch.MEGATRON_ROOT, "finetune_llama.py"), *flags, *passthrough]
    environment = dict(os.environ)
    if facts.name == "cpu":
        environment.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    run_info = {"model_size": os.path.basename(os.path.normpath(hf_model)), "device": facts.name,
                "run": "finetune", "nproc_per_node": nproc, "nnodes": 1, "world_size": nproc, **shape,
                "command": shlex.join(command), "start_time": time.time()}
    log_path = os.path.join(run_dir, TRAIN_LOG_FILE)
    print(f"Run {os.path.basename(run_dir)}: {nproc} {facts.name} processes; log: {log_path}", flush=True)
    job = launch.run_job(command, environment, log_path)
    with open(log_path, encoding="utf-8", errors="replace") as log:
        parsed = parse_log(log)
    launch.write_run_info(run_dir, run_info, launch.how_it_ended(job, parsed, job.returncode == 0))
    if job.returncode != 0:
        raise RunError(f"{job.failure.message or f'fine-tuning failed (exit {job.returncode})'} (log: {log_path})")
    launch.summarize(run_dir)
    exported = os.path.join(run_dir, "hf")
    export_hf(checkpoints, exported)
    print(f"Fine-tuned model (Hugging Face): {exported}", flush=True)


if __name__ == "__main__":
    run_cli(main)
