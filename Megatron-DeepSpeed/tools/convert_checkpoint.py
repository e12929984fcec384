"""Convert a checkpoint of pretrain_gpt.py: reshape it to another tensor/pipeline-parallel layout, export it as a
Hugging Face model of a family in megatron/families/ (GPT-2, Llama, Qwen2, Mistral, Qwen3), or import one. One
CPU process; no distributed world needed. --load reads any layout (recognised from its files): ours and upstream
Megatron-DeepSpeed's (including this project's earlier one), the Megatron layout
(iter_N/mp_rank_XX[_YYY]/model_optim_rng.pt, release) and DeepSpeed universal checkpoints.

    convert_checkpoint.py --load DIR [--iteration N] --save OUT --target-tensor-parallel-size T
                          --target-pipeline-parallel-size P [--target-no-pipeline-parallel] [--weights-only]
                          [--target-expert-parallel-size E]   (a mixture-of-experts model, plain engine)
                          [--target-fp32 | --target-fp16 | --target-bf16]   (its ZeRO-0 Adam state's precision)
                          [--target-data-parallel-size D]   (MoE: ZeRO 1-2 at DP D too; dense, pipeline engine,
                                                             bf16: BF16_Optimizer's ZeRO-0 slices for DP D)
    convert_checkpoint.py --load DIR [--iteration N] --to-hf HF_DIR [--max-shard-size 5GB] [--hf-architecture CLASS]
    convert_checkpoint.py --from-hf HF_DIR --save OUT --target-tensor-parallel-size T
                          --target-pipeline-parallel-size P [--make-vocab-size-divisible-by 128]

A reshaped checkpoint resumes with `pretrain_gpt.py --load OUT` at the target layout and any data-parallel size
and ZeRO stage, with its optimizer state (unless --weights-only), at ZeRO 0 in the precision it was written for
(fp32 unless --target-fp16/--target-bf16 says; on the pipeline engine bf16 needs --target-data-parallel-size and
then resumes at that size); a mixture-of-experts one with its optimizer
state at ZeRO stage 0 only (DeepSpeed keeps that state per expert-parallel rank), in the precision it was written
for (the source's unless a --target-fp32/fp16/bf16 flag says), and at ZeRO 1-2 at the data-parallel size
--target-data-parallel-size names, its expert files keyed by
upstream's module path so that upstream's trainer loads them too; an imported one with `--load OUT --finetune`.
The output directory appears complete or not at all; an existing one is replaced only with --force.
"""
import argparse

from megatron.hf.conversions import export_hf, import_hf
from megatron.checkpoint.reshape.conversions import reshape
from megatron.hf.files import parse_shard_size
from megatron.checkpoint.trust import add_trust_flag, trusting
from megatron.checkpoint.reshape.target_writer import TargetLayout
from megatron.errors import InputError, run_cli
from megatron.families.registry import architectures
from megatron.reports.progress_bar import progress_bar

PRECISIONS = ("fp32", "fp16", "bf16")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--load", help="checkpoint directory (a --save directory, upstream's or Megatron's "
                                       "checkpoint folder, or a universal checkpoint folder)")
    source.add_argument("--from-hf", metavar="HF_DIR",
                        help=f"transformers directory to import ({', '.join(architectures())})")
    parser.add_argument("--iteration", type=int, help="checkpoint iteration to read (default: the one in 'latest')")
    output = parser.add_mutually_exclusive_group(required=True)
    output.add_argument("--save", help="directory to write the converted checkpoint to")
    output.add_argument("--to-hf", metavar="HF_DIR", help="directory to write the checkpoint to as a transformers "
                                                          "model (of the family whose class holds it)")
    parser.add_argument("--hf-architecture", choices=architectures(), metavar="CLASS",
                        help=f"with --to-hf: the transformers class to write ({', '.join(architectures())}) where "
                             "several hold the model (a windowless Mistral is also a Llama; default: the class the "
                             "checkpoint was imported from, else the first of that list)")
    parser.add_argument("--max-shard-size", default="5GB",
                        help="with --to-hf: largest safetensors shard, as transformers writes it (e.g. 5GB, 500MB)")
    parser.add_argument("--target-tensor-parallel-size", type=int, default=1)
    parser.add_argument("--target-pipeline-parallel-size", type=int, default=1)
    parser.add_argument("--target-expert-parallel-size", type=int, default=1,
                        help="a mixture-of-experts model's --moe-expert-parallel-size to resume at")
    parser.add_argument("--target-no-pipeline-parallel", action="store_true",
                        help="for a run with --no-pipeline-parallel (DeepSpeed's plain engine; needs PP 1)")
    parser.add_argument("--target-data-parallel-size", type=int,
                        help="a mixture-of-experts model's Adam state also as ZeRO 1-2 partitions for a run at this "
                             "data-parallel size (world size / TP), which then loads at ZeRO 1-2 at this size only; "
                             "a dense model's with --target-bf16 on the pipeline engine, as BF16_Optimizer's ZeRO-0 "
                             "slices for a run at this data-parallel size (world size / (TP x PP))")
    precision = parser.add_mutually_exclusive_group()
    for name in PRECISIONS:
        precision.add_argument(f"--target-{name}", dest="target_precision", action="store_const", const=name,
                               help=f"the Adam state for a run in {name} at --zero-stage 0 (default: a dense model's "
                                    "fp32, a mixture-of-experts model's the precision the source trained in)")
    parser.add_argument("--weights-only", action="store_true",
                        help="leave the optimizer state out (a resumed run starts it fresh)")
    parser.add_argument("--make-vocab-size-divisible-by", type=int, default=128,
                        help="with --from-hf: pad the vocabulary to a multiple of this x target TP size")
    parser.add_argument("--force", action="store_true", help="replace an existing output directory")
    add_trust_flag(parser)
    args = parser.parse_args(argv)
    if args.from_hf and args.to_hf:
        raise InputError("--from-hf and --to-hf together convert nothing; give --save with --from-hf")
    if args.hf_architecture and not args.to_hf:
        raise InputError(f"--hf-architecture {args.hf_architecture} names the class --to-hf writes; give --to-hf")
    if args.from_hf and args.iteration is not None:
        raise InputError("--iteration selects a checkpoint of --load; a --from-hf directory has only one model")
    return args


def main(argv=None):
    args = parse_args(argv)
    with trusting(args.trust_checkpoint):
        convert(args)


def convert(args) -> None:
    target = TargetLayout(args.target_tensor_parallel_size, args.target_pipeline_parallel_size,
                          pipeline_engine=not args.target_no_pipeline_parallel,
                          expert=args.target_expert_parallel_size, data=args.target_data_parallel_size)
    if args.to_hf:
        print(f"exporting {args.load} as a Hugging Face model to {args.to_hf}", flush=True)
        with progress_bar("exporting") as progress:
            source = export_hf(args.load, args.to_hf, args.iteration, args.force, progress,
                               parse_shard_size(args.max_shard_size), args.hf_architecture)
        print(f"wrote {args.to_hf} from iteration {source.iteration} ({source.layout.describe()})")
    elif args.from_hf:
        print(f"importing {args.from_hf} to {args.save} at {target.describe()}", flush=True)
        with progress_bar("importing") as progress:
            config = import_hf(args.from_hf, args.save, target, args.make_vocab_size_divisible_by, args.force,
                               progress)
        print(f"wrote {args.save}: {config.num_layers} layers, hidden {config.hidden_size}, padded vocabulary "
              f"{config.vocab_size}; fine-tune it with --load {args.save} --finetune")
    else:
        print(f"reshaping {args.load} to {target.describe()} in {args.save}", flush=True)
        with progress_bar("reshaping") as progress:
            source = reshape(args.load, args.save, target, args.iteration, args.weights_only, args.force, progress,
                             args.target_precision)
        optimizer = ("weights and optimizer state" if source.has_optimizer_state and not args.weights_only else
                     "weights only")
        print(f"wrote {args.save}: iteration {source.iteration} ({optimizer}), from {source.layout.describe()}; "
              f"padded vocabulary {source.padded_vocab_size} kept; resume with --load {args.save}")


if __name__ == "__main__":
    run_cli(main)
