"""Which layouts fit a model on N devices of M GiB, and which is fastest, before a job is queued.

    plan_layout.py --model-size 1.3B --devices 8 --device-memory 80
    plan_layout.py --num-layers 32 --hidden-size 4096 --num-attention-heads 32 --seq-length 2048 \\
        --global-batch-size 512 --devices 64 --nodes 8 --device-memory 80 --json
    plan_layout.py --model-size 1.3B_MoE128 --devices 64 --nodes 8 --device-memory 80 --topk 2

Prints one row per layout (TP, PP, DP, ZeRO stage, micro-batch, recompute, sequence parallelism, the
DeepSpeed-Ulysses size (layouts with it need --no-pipeline-parallel, as the trainer does), and for a
mixture-of-experts model (the MoE presets or pretrain_gpt.py's MoE flags) expert parallelism EP) with the
estimated memory per device by term (GiB) and the estimated step time; layouts that fit come first, fastest
first. The estimates are megatron/planning's (docs/ARCHITECTURE.md, Layout planner, and docs/benchmarks.md compares them
with measured peaks). `--json` prints every layout with all figures in bytes and seconds.
"""
import argparse
import json
from dataclasses import asdict

from megatron.config.flags import moe as moe_flags
from megatron.config.presets import get_preset, preset_names
from megatron.errors import InputError, run_cli
from megatron.planning.memory import FRAGMENTATION
from megatron.planning.search import GIB, MOE_NO_PIPELINE, ranked_plans
from megatron.planning.shape import GPT2_VOCAB_SIZE, ModelShape, TrainingSettings, shape_from_preset
from megatron.planning.step_time import Hardware

SHAPE_FLAGS = ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "global_batch_size")
COLUMNS = ("TP", "PP", "DP", "ZeRO", "mbs", "recompute", "SP", "Ulysses", "weights", "grads", "optimizer", "activations",
           "in flight", "logits", "stage", "total GiB", "fits", "step s", "samples/s")
MOE_COLUMNS = COLUMNS[:8] + ("EP",) + COLUMNS[8:]


def positive(kind):
    def parse(text):
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text} must be positive")
        return value
    return parse


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-size", choices=preset_names(), help="a preset; model flags below override it")
    for flag in SHAPE_FLAGS:
        parser.add_argument("--" + flag.replace("_", "-"), type=positive(int))
    parser.add_argument("--max-position-embeddings", type=positive(int), help="default: --seq-length")
    parser.add_argument("--ffn-hidden-size", type=positive(int), help="default: 4 x hidden")
    parser.add_argument("--vocab-size", type=positive(int), default=GPT2_VOCAB_SIZE,
                        help="the tokenizer's, before padding (default: GPT-2's)")
    parser.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16")
    parser.add_argument("--hidden-dropout", type=float, default=0.0)
    parser.add_argument("--no-pipeline-parallel", action="store_true", help="the plain engine (PP 1 only)")
    parser.add_argument("--zero-reduce-bucket-size", type=positive(int),
                        help="zero_optimization.reduce_bucket_size in elements, as pretrain_gpt.py's flag (DeepSpeed "
                             "allocates this much for ZeRO 1-3 whatever the model's size; default: the trainer's, "
                             "a rank's parameter count up to DeepSpeed's 5e8)")
    moe_flags.add_flags(parser)  # pretrain_gpt.py's; --moe-expert-parallel-size fixes EP, else every EP is tried
    parser.add_argument("--devices", type=positive(int), required=True, help="devices in the whole job")
    parser.add_argument("--nodes", type=positive(int), default=1)
    parser.add_argument("--device-memory", type=positive(float), required=True, help="GiB per device")
    parser.add_argument("--peak-tflops", type=positive(float), default=Hardware.peak_tflops,
                        help="dense peak per device in the training dtype (default: H100 SXM bf16)")
    parser.add_argument("--utilization", type=positive(float), default=Hardware.utilization,
                        help="share of the peak the compute reaches")
    parser.add_argument("--intra-node-bandwidth", type=positive(float), default=Hardware.intra_node_gbps,
                        help="GB/s per device within a node")
    parser.add_argument("--inter-node-bandwidth", type=positive(float), default=Hardware.inter_node_gbps,
                        help="GB/s per device across nodes")
    parser.add_argument("--fragmentation", type=float, default=FRAGMENTATION,
                        help="allowance for the allocator, as a share of the rest")
    parser.add_argument("--top", type=positive(int), default=20, help="rows of the table (fitting ones first)")
    parser.add_argument("--json", action="store_true", help="every layout, as JSON")
    return parser.parse_args(argv)


def moe_section(args, preset: dict, num_layers: int):
    """The MoE section of the preset and the MoE flags, checked by pretrain_gpt.py's rules (one line each); None
    for a dense model. A preset's EP is not kept: the planner tries every EP unless the flag gives one."""
    values = dict(vars(args))
    for dest, default in moe_flags.PRESET_DEFAULTS.items():
        if values[dest] is None:
            values[dest] = preset.get(dest, default)
    values["moe_expert_parallel_size"] = args.moe_expert_parallel_size or 1
    values["num_layers"] = num_layers
    if max(values["num_experts"]) == 1:
        return None
    moe_flags.validate({**values, "world_size": args.devices, "ds_pipeline_enabled": False,
                        "sequence_parallel": False, "zero_stage": 0})
    return moe_flags.section(values)


def job_from_args(args) -> tuple[ModelShape, TrainingSettings]:
    preset = get_preset(args.model_size) if args.model_size else {}
    if args.model_size:
        shape, settings = shape_from_preset(args.model_size, args.vocab_size)
        values = {**vars(shape), "global_batch_size": settings.global_batch_size}
    else:
        missing = [flag for flag in SHAPE_FLAGS if getattr(args, flag) is None]
        if missing:
            raise InputError(f"--{missing[0].replace('_', '-')} is needed without --model-size (or give a preset: "
                             f"{', '.join(preset_names())})")
        values = {"vocab_size": args.vocab_size}
    values.update({flag: getattr(args, flag) for flag in (*SHAPE_FLAGS, "max_position_embeddings",
                                                           "ffn_hidden_size") if getattr(args, flag) is not None})
    values.setdefault("max_position_embeddings", values["seq_length"])
    values["moe"] = moe_section(args, preset, values["num_layers"])
    shape = ModelShape(**{key: value for key, value in values.items() if key != "global_batch_size"})
    settings = TrainingSettings(global_batch_size=values["global_batch_size"], dtype=args.dtype,
                                hidden_dropout=args.hidden_dropout,
                                pipeline_engine=not (args.no_pipeline_parallel or shape.has_experts),
                                zero_reduce_bucket_size=args.zero_reduce_bucket_size)
    return shape, settings


def table_row(plan, settings, experts: bool) -> list:
    layout, memory = plan.layout, plan.memory
    gib = [getattr(memory, term) / GIB for term in ("weights", "gradients", "optimizer", "activations",
                                                      "pipeline_in_flight", "logits_and_loss")]
    return [layout.tensor, layout.pipeline, layout.data, layout.zero_stage, layout.micro_batch,
            "yes" if layout.recompute else "no", "yes" if layout.sequence_parallel else "no", layout.ulysses,
            *([layout.expert_parallel] if experts else []), *(f"{value:.2f}" for value in gib), memory.stage,
            f"{memory.total / GIB:.2f}", "yes" if plan.fits else "NO",
            f"{plan.step_time.total:.3f}", f"{plan.samples_per_second(settings):.1f}"]


def markdown(columns, rows) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return "\n".join(lines + ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows])


def main(argv=None):
    args = parse_args(argv)
    if args.devices % args.nodes:
        raise InputError(f"--devices={args.devices} is not a multiple of --nodes={args.nodes}")
    shape, settings = job_from_args(args)
    hardware = Hardware(args.devices // args.nodes, args.peak_tflops, args.utilization, args.intra_node_bandwidth,
                        args.inter_node_bandwidth)
    plans = ranked_plans(shape, settings, args.devices, hardware, args.device_memory * GIB, args.fragmentation,
                         args.moe_expert_parallel_size)
    if not plans:
        raise InputError(f"no layout of {args.devices} devices suits this model (TP must divide the heads and stay "
                         f"within a node, DP the global batch size {settings.global_batch_size}"
                         + (", EP divide DP and every expert count" if shape.has_experts else "") + ")")
    if args.json:
        print(json.dumps({"model": asdict(shape), "settings": vars(settings), "hardware": vars(hardware),
                          "plans": [plan.as_dict(settings) for plan in plans]}, indent=1))
        return 0
    fitting = sum(plan.fits for plan in plans)
    print(f"{len(plans)} layouts, {fitting} fit in {args.device_memory:g} GiB; memory in GiB per device "
          f"(the heaviest stage), step time at {hardware.utilization:.0%} of {hardware.peak_tflops:g} TFLOP/s, "
          f"{hardware.intra_node_gbps:g} GB/s within and {hardware.inter_node_gbps:g} GB/s across nodes; ZeRO 2-3 "
          f"rows run with --no-pipeline-parallel" + (f"; {MOE_NO_PIPELINE}" if shape.has_experts else ""))
    experts = shape.has_experts
    print(markdown(MOE_COLUMNS if experts else COLUMNS,
                   [table_row(plan, settings, experts) for plan in plans[:args.top]]))
    return 0


if __name__ == "__main__":
    run_cli(main)
