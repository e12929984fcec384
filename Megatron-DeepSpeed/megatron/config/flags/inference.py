"""Flags of generation and zero-shot evaluation (tools/generate_text.py, tasks/zeroshot_gpt/evaluate.py): which
checkpoint to load, how to split it over processes, with which tokenizer and precision. They are the training
groups' flags; what differs is here: a checkpoint is required, the layout flags default to 1, the tokenizer flags
to what the model was trained with, and a pipeline split is refused."""
from typing import Mapping

from megatron.config.flags import parallelism, precision, stopping, tokenizer, training
from megatron.config.flags.checkpointing import TRUST_ARGUMENTS, TRUST_FLAG
from megatron.errors import InputError


# Upstream's generate_samples_gpt.py takes the model's shape on its command line; here the checkpoint records it,
# so these are accepted for its users' scripts and must agree with the checkpoint (inference/command_line.py).
MODEL_SHAPE_FLAGS = ("num_layers", "hidden_size", "num_attention_heads", "max_position_embeddings", "seq_length")


def add_flags(parser, seq_length_flag: bool = True) -> None:
    """`seq_length_flag` False where the tool gives --seq-length its own meaning."""
    shape = parser.add_argument_group("model shape (optional: checked against the checkpoint)")
    checked = MODEL_SHAPE_FLAGS if seq_length_flag else MODEL_SHAPE_FLAGS[:-1]
    parser.set_defaults(model_shape_flags=checked)
    for name in checked:
        shape.add_argument(f"--{name.replace('_', '-')}", type=int,
                           help="As upstream's generation scripts take it; must equal the checkpoint's.")
    group = parser.add_argument_group("checkpoint and parallelism")
    group.add_argument("--load", required=True,
                       help="The --save directory of a training run (any TP x PP x DP layout and ZeRO stage), or one "
                            "of its global_step{N} directories.")
    group.add_argument("--iteration", type=int, help="Load this iteration's checkpoint instead of the latest.")
    group.add_argument(TRUST_FLAG, **TRUST_ARGUMENTS)
    parallelism.add_model_parallel_flags(
        group, default=1,
        tensor_help="Split the model over this many processes; the others are data-parallel replicas.",
        pipeline_help="Only 1: every tensor-parallel group holds all layers (checkpoints of any pipeline layout "
                      "load as they are).")
    parallelism.add_backend_flag(group)
    stopping.add_timeout_flag(group)
    training.add_micro_batch_flag(group, default=8, help="Sequences processed together per replica.")
    precision.add_dtype_flags(group.add_mutually_exclusive_group())
    tokenizer.add_flags(parser, as_trained=True)


def validate(values: Mapping) -> None:
    """The checks that need no process group, so that they fail before anything starts."""
    if values["pipeline_model_parallel_size"] != 1:
        raise InputError(f"--pipeline-model-parallel-size {values['pipeline_model_parallel_size']}: generation and "
                         "evaluation run every layer in each tensor-parallel group; drop the flag (a checkpoint "
                         "trained with pipeline parallelism loads directly, whatever its layout)")
    if values["micro_batch_size"] < 1:
        raise InputError(f"--micro-batch-size {values['micro_batch_size']} must be at least 1")
