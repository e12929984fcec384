"""usage: evaluate_harness.py --model megatron_gpt --model_args load=DIR[,ARG=VALUE...] --tasks T1[,T2...]
                           [any other flag of `lm_eval run`]

lm-evaluation-harness on a checkpoint of this project, at any layout, in one process (the TP x PP shards are
joined while they load):

    python tools/evaluate_harness.py --model megatron_gpt --model_args load=checkpoints/gpt
        --tasks hellaswag,arc_easy,mmlu --batch_size 8 --output_path results/      (one command line)

This is lm_eval's own command line (every flag of `lm_eval run --help`) with the model type megatron_gpt
registered (megatron/evaluation/lm_harness.py). --model_args: load=DIR (required), iteration=N, dtype=float32 |
bfloat16 | float16, max_gen_toks=N, seed=N, and any tokenizer flag (tokenizer_type, vocab_file, merge_file,
tokenizer_model, vocab_size) to override the one the checkpoint records. The device is the trainer's (the
accelerator when there is one, else the CPU). Tasks come from lm-eval (downloaded by `datasets`, or from its
local cache with HF_DATASETS_OFFLINE=1) or from --include_path DIR of task YAML files. See docs/lm-eval.md.
"""
import sys

from megatron.errors import run_cli


def main(argv=None):
    arguments = sys.argv[1:] if argv is None else list(argv)
    if not arguments or arguments[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    from deepspeed_npu import activate  # first: on an Ascend host it selects the NPU before the model is built
    activate()
    from lm_eval.__main__ import cli_evaluate

    from megatron.evaluation import lm_harness  # noqa: F401  registers megatron_gpt with lm_eval
    sys.argv = [sys.argv[0], *arguments]  # lm_eval's command line reads sys.argv
    return cli_evaluate()


if __name__ == "__main__":
    run_cli(main)
