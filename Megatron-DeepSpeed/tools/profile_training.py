"""Profile a few iterations of a training run (see megatron/training/profiler.py).

    python Megatron-DeepSpeed/tools/profile_training.py --output-dir DIR [--warmup N] [--active N] -- <pretrain_gpt.py flags>

The flags must train at least warmup + active iterations and keep --log-interval 1 (the default here).
"""
import argparse

from megatron.errors import run_cli


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output-dir", required=True, help="a new directory for operators.txt and trace.json")
    parser.add_argument("--warmup", type=int, default=5, help="iterations before recording (default 5)")
    parser.add_argument("--active", type=int, default=3, help="iterations recorded (default 3)")
    parser.add_argument("pretrain_flags", nargs=argparse.REMAINDER, help="after --: the training flags")
    options = parser.parse_args(argv)
    flags = [flag for flag in options.pretrain_flags if flag != "--"]

    from deepspeed_npu import activate
    npu = activate()
    from megatron.model.provider import model_provider
    from megatron.training.loop import pretrain
    from megatron.training.profiler import profile_training

    print(profile_training(lambda args: pretrain(model_provider, args, adaptor_kernels=npu.kernels),
                           ["--log-interval", "1", *flags], options.warmup, options.active, options.output_dir))


if __name__ == "__main__":
    run_cli(main)
