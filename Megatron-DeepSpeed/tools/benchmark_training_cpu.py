"""Per-step overhead on CPU: our pretrain_gpt.py step (DeepSpeed engine, fp32) versus a plain PyTorch loop.

The yardstick is tools/benchmarks/bare_loop.py: a GPT-2 of the same shape, forward, backward, clipping and
torch's AdamW, wrapped in DistributedDataParallel on two processes. For each shape and layout, both run in
fresh processes (torchrun --standalone) on the same batch shape, --log-interval iterations at a time: one
interval of warm-up, --timed intervals timed, then --profiled intervals under cProfile, whose time is sorted
into the kinds of work a step does (tools/benchmarks/step_overhead.py). Printed per iteration: our step time,
the bare loop's, the difference, the ratio of tokens/s (bare time / ours), each as wall time and as the
process's CPU time (the last rank's; steadier where other jobs share the cores), its minor page faults (a
fresh page's first touch: what a buffer allocated anew each step costs a CPU, spread over the operators that
write it; --keep-freed-memory runs both with glibc keeping freed memory mapped), and where our extra time goes
(profiled ms of ours minus the bare loop's, per category; cProfile inflates Python-heavy code, so these rank
the causes rather than add up to the difference), and DeepSpeed's own time by function (file:line under the
installed deepspeed package, profiled ms per iteration: the floor no flag of ours removes). Medians over
--rounds alternating rounds.

  python tools/benchmark_training_cpu.py [--shapes tiny,default] [--layouts all] [--rounds 3] [--json OUT]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from megatron.errors import InputError, RunError, run_cli

SHAPES = {"tiny": dict(layers=2, hidden=64, heads=4, seq=128, batch=4, vocab=8192),
          "default": dict(layers=4, hidden=256, heads=8, seq=256, batch=8, vocab=8192)}
# name: (processes, pretrain_gpt.py flags)
LAYOUTS = {"plain-z0-dp1": (1, ["--no-pipeline-parallel", "--zero-stage", "0"]),
           "plain-z1-dp1": (1, ["--no-pipeline-parallel", "--zero-stage", "1"]),
           "plain-z0-dp2": (2, ["--no-pipeline-parallel", "--zero-stage", "0"]),
           "plain-z1-dp2": (2, ["--no-pipeline-parallel", "--zero-stage", "1"]),
           "pipeline-pp1": (1, ["--zero-stage", "0"]),  # pretrain_gpt.py's default engine
           # bf16 ZeRO (the accelerators' path: NonFiniteStepGuard); the bare loop stays fp32, so compare ours
           # against ours of another version here, not the ratio
           "plain-z1-dp1-bf16": (1, ["--no-pipeline-parallel", "--zero-stage", "1", "--bf16"]),
           "plain-z1-dp2-bf16": (2, ["--no-pipeline-parallel", "--zero-stage", "1", "--bf16"])}


def pretrain_flags(shape: dict, processes: int, iterations: int, log_interval: int) -> list:
    return ["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", str(shape["vocab"] - 1),
            "--make-vocab-size-divisible-by", "1", "--num-layers", str(shape["layers"]),
            "--hidden-size", str(shape["hidden"]), "--num-attention-heads", str(shape["heads"]),
            "--seq-length", str(shape["seq"]), "--micro-batch-size", str(shape["batch"]),
            "--global-batch-size", str(shape["batch"] * processes), "--train-iters", str(iterations),
            "--lr", "1e-4", "--hidden-dropout", "0", "--attention-dropout", "0", "--log-interval", str(log_interval),
            "--eval-iters", "0", "--num-workers", "0"]


def worker(options) -> None:
    """One measurement in this (torchrun) process: ours or the bare loop; the last rank writes the figures."""
    import torch.distributed as dist

    from megatron.files.atomic import write_text_atomically
    from benchmarks import bare_loop, step_overhead  # tools/benchmarks/, beside this script

    shape, interval = SHAPES[options.shape], options.log_interval
    processes, layout_flags = LAYOUTS[options.layout]
    first_profiled = 1 + options.timed  # iteration lines: 1 warm-up, then the timed, then the profiled
    if options.worker == "ours":
        from megatron.model.provider import model_provider
        from megatron.training.loop import pretrain
        argv = pretrain_flags(shape, processes, interval * (first_profiled + options.profiled), interval) + layout_flags
        window = step_overhead.record_training(lambda: pretrain(model_provider, argv), first_profiled,
                                               first_profiled + options.profiled)
        timed, stats, collecting = window.elapsed_ms[1:first_profiled], window.stats(), window.collector.seconds
        timed_cpu, timed_faults = window.cpu_ms[:first_profiled - 1], window.page_faults[:first_profiled - 1]
    else:
        if processes > 1:
            dist.init_process_group("gloo")
        step = bare_loop.BareLoop(bare_loop.Shape(**shape))
        timed, timed_cpu, timed_faults = (means[1:] for means in
                                          bare_loop.interval_means_ms(step, 1 + options.timed, interval))
        stats, collecting = step_overhead.profile_calls(step, interval * options.profiled)
    if dist.is_initialized() and dist.get_rank() != dist.get_world_size() - 1:
        return
    iterations = interval * options.profiled
    categories = {name: seconds * 1000.0 / iterations for name, seconds in step_overhead.breakdown(stats).items()}
    categories[step_overhead.GARBAGE_COLLECTOR] = collecting * 1000.0 / iterations
    functions = {where: seconds * 1000.0 / iterations
                 for where, seconds in step_overhead.functions_in(stats, "deepspeed/", options.top)}
    figures = {"ms": statistics.median(timed), "cpu_ms": statistics.median(timed_cpu), "profiled_ms": categories,
               "page_faults": statistics.median(timed_faults), "deepspeed_functions_ms": functions}
    write_text_atomically(options.result, json.dumps(figures))


def measure(which: str, shape: str, layout: str, options) -> dict:
    processes = LAYOUTS[layout][0]
    with tempfile.TemporaryDirectory() as scratch:
        result = os.path.join(scratch, "result.json")
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes),
                   os.path.abspath(__file__), "--worker", which, "--shape", shape, "--layout", layout,
                   "--result", result, "--log-interval", str(options.log_interval), "--timed", str(options.timed),
                   "--profiled", str(options.profiled), "--top", str(options.top)]
        environment = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": str(options.threads)}
        if options.keep_freed_memory:  # glibc's tunables: every allocation from the heap, which is never trimmed
            environment.update(MALLOC_MMAP_THRESHOLD_=str(1 << 32), MALLOC_TRIM_THRESHOLD_=str(1 << 32))
        done = subprocess.run(command, capture_output=True, text=True, env=environment)
        if done.returncode:
            raise RunError(f"{which} at {shape}/{layout} failed:\n{done.stderr[-3000:]}")
        with open(result) as figures:
            return json.load(figures)


def summarize(rounds: list) -> dict:
    """Medians over rounds of step times and of the per-category profiled difference (ours - bare)."""
    ours, bare = statistics.median(r["ours"]["ms"] for r in rounds), statistics.median(r["bare"]["ms"] for r in rounds)
    categories = rounds[0]["ours"]["profiled_ms"].keys()
    extra = {name: statistics.median(r["ours"]["profiled_ms"][name] - r["bare"]["profiled_ms"][name] for r in rounds)
             for name in categories}
    ours_cpu = statistics.median(r["ours"]["cpu_ms"] for r in rounds)
    bare_cpu = statistics.median(r["bare"]["cpu_ms"] for r in rounds)
    return {"ours_ms": ours, "bare_ms": bare, "difference_ms": ours - bare, "ratio": bare / ours,
            "rounds": [(r["ours"]["ms"], r["bare"]["ms"]) for r in rounds], "profiled_extra_ms": extra,
            "ours_cpu_ms": ours_cpu, "bare_cpu_ms": bare_cpu, "cpu_ratio": bare_cpu / ours_cpu,
            "cpu_rounds": [(r["ours"]["cpu_ms"], r["bare"]["cpu_ms"]) for r in rounds],
            "page_faults": (statistics.median(r["ours"]["page_faults"] for r in rounds),
                            statistics.median(r["bare"]["page_faults"] for r in rounds)),
            "profiled_ours_ms": {name: statistics.median(r["ours"]["profiled_ms"][name] for r in rounds)
                                 for name in categories},
            "deepspeed_functions_ms": {where: statistics.median(r["ours"]["deepspeed_functions_ms"].get(where, 0.0)
                                                                for r in rounds)
                                       for where in rounds[0]["ours"]["deepspeed_functions_ms"]}}


def report(shape: str, layout: str, summary: dict, top: int) -> str:
    extra = sorted(summary["profiled_extra_ms"].items(), key=lambda item: -item[1])
    causes = ", ".join(f"{name} {ms:+.1f}" for name, ms in extra[:top])
    return (f"{shape:8s} {layout:13s} ours {summary['ours_ms']:8.1f} ms  bare {summary['bare_ms']:8.1f} ms  "
            f"difference {summary['difference_ms']:+7.1f} ms  ratio {summary['ratio']:.2f}  rounds "
            + ", ".join(f"{ours:.1f}/{bare:.1f}" for ours, bare in summary["rounds"]) + "\n"
            f"    CPU time: ours {summary['ours_cpu_ms']:8.1f} ms  bare {summary['bare_cpu_ms']:8.1f} ms  "
            f"difference {summary['ours_cpu_ms'] - summary['bare_cpu_ms']:+7.1f} ms  ratio {summary['cpu_ratio']:.2f}"
            "  rounds " + ", ".join(f"{ours:.1f}/{bare:.1f}" for ours, bare in summary["cpu_rounds"]) + "\n"
            f"    minor page faults per iteration: ours {summary['page_faults'][0]:.0f}  bare "
            f"{summary['page_faults'][1]:.0f}\n"
            f"    profiled extra ms/iteration: {causes}\n"
            "    DeepSpeed's own profiled ms/iteration by function: "
            + "; ".join(f"{where} {ms:.2f}" for where, ms in summary["deepspeed_functions_ms"].items()))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="tiny,default", help=f"comma-separated, of {', '.join(SHAPES)}")
    parser.add_argument("--layouts", default="all", help=f"comma-separated, of {', '.join(LAYOUTS)}, or all")
    parser.add_argument("--rounds", type=int, default=3,
                        help="alternate ours and the bare loop this many times and take medians: a shared "
                             "machine's speed drifts by 10-20%% from minute to minute")
    parser.add_argument("--log-interval", type=int, default=10, help="iterations per timed interval (default 10)")
    parser.add_argument("--timed", type=int, default=3, help="intervals timed, after one of warm-up (default 3)")
    parser.add_argument("--profiled", type=int, default=2, help="intervals under cProfile (default 2)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads per process (default 1: on a machine shared with other jobs, a "
                             "multi-threaded step stalls whenever one of its threads is descheduled)")
    parser.add_argument("--keep-freed-memory", action="store_true",
                        help="run both with glibc's allocator keeping freed memory mapped (MALLOC_MMAP_THRESHOLD_, "
                             "MALLOC_TRIM_THRESHOLD_): no step pays first-touch page faults for buffers it "
                             "allocates anew, so the two compare without the allocator's part")
    parser.add_argument("--top", type=int, default=5,
                        help="categories and DeepSpeed functions printed per layout (default 5)")
    parser.add_argument("--json", help="also write every figure to this file")
    parser.add_argument("--worker", choices=("ours", "bare"), help=argparse.SUPPRESS)
    parser.add_argument("--shape", help=argparse.SUPPRESS)
    parser.add_argument("--layout", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.worker:
        return worker(options)
    shapes = options.shapes.split(",")
    layouts = list(LAYOUTS) if options.layouts == "all" else options.layouts.split(",")
    unknown = [name for name in shapes if name not in SHAPES] + [name for name in layouts if name not in LAYOUTS]
    if unknown:
        raise InputError(f"--shapes/--layouts: unknown {', '.join(unknown)}; shapes are {', '.join(SHAPES)}, "
                         f"layouts {', '.join(LAYOUTS)} or all")
    figures = {}
    for shape in shapes:
        for layout in layouts:
            rounds = [{"ours": measure("ours", shape, layout, options), "bare": measure("bare", shape, layout, options)}
                      for _ in range(options.rounds)]
            figures[f"{shape}/{layout}"] = summarize(rounds)
            print(report(shape, layout, figures[f"{shape}/{layout}"], options.top), flush=True)
    if options.json:
        from megatron.files.atomic import write_text_atomically
        write_text_atomically(options.json, json.dumps(figures, indent=1))


if __name__ == "__main__":
    run_cli(main)
