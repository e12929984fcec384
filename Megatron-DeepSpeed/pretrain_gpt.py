"""Pre-train a GPT model (Megatron-DeepSpeed's flags). Single process:
    python pretrain_gpt.py --num-layers 2 --hidden-size 64 ... --data-path data/demo_text_document ...
Several processes: torchrun --nproc_per_node N pretrain_gpt.py ... (or the deepspeed launcher).
As in Megatron-DeepSpeed, the model runs on DeepSpeed's pipeline engine (any --pipeline-model-parallel-size,
1 included); --no-pipeline-parallel trains the plain model on DeepSpeed's plain engine instead.
"""
import os
import sys

from megatron.errors import run_cli
from megatron.model.gpt import GPTConfig, GPTModel
from megatron.model.parallelize import apply_tensor_parallel
from megatron.model.pipe import GPTPipe


def gpt_config(args, padded_vocab_size: int) -> GPTConfig:
    return GPTConfig(
        vocab_size=padded_vocab_size, max_position_embeddings=args.max_position_embeddings,
        num_layers=args.num_layers, hidden_size=args.hidden_size, num_attention_heads=args.num_attention_heads,
        ffn_hidden_size=args.ffn_hidden_size, hidden_dropout=args.hidden_dropout,
        attention_dropout=args.attention_dropout, init_method_std=args.init_method_std,
        openai_gelu=args.openai_gelu, checkpoint_activations=args.checkpoint_activations, init_seed=args.seed)


def model_provider(args, padded_vocab_size: int, parallel, rng_tracker):
    """This rank's part of the model, parallelised as `parallel` (a ParallelState) says: its pipeline stage,
    or with --no-pipeline-parallel the whole plain model, tensor-parallel pieces sharded either way."""
    config = gpt_config(args, padded_vocab_size)
    if args.ds_pipeline_enabled:
        return GPTPipe(config, parallel, rng_tracker, args.sequence_parallel)
    model = GPTModel(config)
    if args.tensor_model_parallel_size > 1:
        apply_tensor_parallel(model, parallel, args.sequence_parallel, rng_tracker=rng_tracker)
    return model


def activate_npu_support() -> None:
    """On an Ascend host the repository's deepspeed_npu adaptor selects the NPU, hccl and the NPU kernels (each
    process registers its own); elsewhere it does nothing. It patches nothing."""
    sys.path.append(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "DeepSpeed"))
    from deepspeed_npu import activate
    activate()


def main(argv=None):
    activate_npu_support()
    from megatron.training import pretrain
    pretrain(model_provider, argv)


if __name__ == "__main__":
    run_cli(main)
