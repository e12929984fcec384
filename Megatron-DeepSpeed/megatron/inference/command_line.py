"""What the generation and zero-shot evaluation command lines share: the flags that say which checkpoint to
load, how to split it over processes and with which tokenizer and precision, and turning them into a loaded
model. Launch like training: `torchrun --nproc_per_node N tool.py ...`; the ranks beyond the tensor-parallel
size form data-parallel replicas that share the work.
"""
import argparse
from dataclasses import dataclass
from typing import Optional

import torch

from megatron import device
from megatron.checkpoint.reader import Checkpoint
from megatron.config.flags.parallelism import DISTRIBUTED_BACKENDS
from megatron.errors import InputError
from megatron.inference.loading import (TOKENIZER_FLAGS, build_checkpoint_tokenizer, check_vocabulary, load_model,
                                        recorded_flags)
from megatron.model.gpt import GPTModel
from megatron.model.kernels import select_kernels
from megatron.parallel_state import ParallelState
from megatron.tokenizer import TOKENIZER_TYPES


def add_checkpoint_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    group = parser.add_argument_group("checkpoint, parallelism and tokenizer")
    group.add_argument("--load", required=True,
                       help="The --save directory of a training run (any TP x PP x DP layout and ZeRO stage), or one "
                            "of its global_step{N} directories.")
    group.add_argument("--iteration", type=int, help="Load this iteration's checkpoint instead of the latest.")
    group.add_argument("--tensor-model-parallel-size", type=int, default=1,
                       help="Split the model over this many processes; the others are data-parallel replicas.")
    group.add_argument("--pipeline-model-parallel-size", type=int, default=1,
                       help="Only 1: every tensor-parallel group holds all layers (checkpoints of any pipeline "
                            "layout load as they are).")
    group.add_argument("--distributed-backend", choices=DISTRIBUTED_BACKENDS,
                       help="Default: chosen by the device (nccl, hccl or gloo).")
    group.add_argument("--distributed-timeout-minutes", type=float, default=10.0,
                       help="A collective that waits longer than this for a peer rank ends the run.")
    group.add_argument("--tokenizer-type", choices=TOKENIZER_TYPES, help="Default: as the model was trained.")
    group.add_argument("--vocab-file", help="GPT-2 vocab.json. Default: as the model was trained.")
    group.add_argument("--merge-file", help="GPT-2 merges.txt. Default: as the model was trained.")
    group.add_argument("--tokenizer-model", help="SentencePiece model. Default: as the model was trained.")
    group.add_argument("--vocab-size", type=int, help="NullTokenizer's vocabulary size. Default: as trained.")
    group.add_argument("--micro-batch-size", type=int, default=8, help="Sequences processed together per replica.")
    precision = group.add_mutually_exclusive_group()
    precision.add_argument("--bf16", action="store_true", help="Run in bfloat16 (default fp32).")
    precision.add_argument("--fp16", action="store_true", help="Run in float16 (not on CPU).")
    return parser


@dataclass(frozen=True)
class LoadedModel:
    model: GPTModel  # this rank's shard, eval mode
    tokenizer: object
    parallel: ParallelState
    checkpoint: Checkpoint

    @property
    def tensor_parallel_group(self):
        return self.parallel.get_tensor_model_parallel_group()

    def data_parallel(self) -> dict:
        """The data-parallel keyword arguments of the generation and evaluation functions."""
        return dict(data_parallel_rank=self.parallel.dp_rank,
                    data_parallel_size=self.parallel.get_data_parallel_world_size())


def _dtype(args) -> torch.dtype:
    dtype = torch.bfloat16 if args.bf16 else torch.float16 if args.fp16 else torch.float32
    if not device.supports_dtype(dtype):
        raise InputError(f"--{'bf16' if args.bf16 else 'fp16'} is not supported on device '{device.device_name()}'; "
                         "leave it off to run in fp32")
    return dtype


def check_checkpoint_args(args) -> None:
    """The checks that need no process group, so that they fail before anything starts."""
    if args.pipeline_model_parallel_size != 1:
        raise InputError(f"--pipeline-model-parallel-size {args.pipeline_model_parallel_size}: generation and "
                         "evaluation run every layer in each tensor-parallel group; drop the flag (a checkpoint "
                         "trained with pipeline parallelism loads directly, whatever its layout)")
    if args.micro_batch_size < 1:
        raise InputError(f"--micro-batch-size {args.micro_batch_size} must be at least 1")
    if not args.distributed_timeout_minutes > 0:
        raise InputError(f"--distributed-timeout-minutes {args.distributed_timeout_minutes:g} must be greater than 0")


def tokenizer_from_flags(args):
    """(tokenizer, the checkpoint's recorded flags): the tokenizer flags given, each missing one as the model was
    trained. Cheap, so that prompts and data can be checked before the model is loaded."""
    check_checkpoint_args(args)
    recorded = recorded_flags(args.load, args.iteration)
    tokenizer = build_checkpoint_tokenizer({name: getattr(args, name) for name in TOKENIZER_FLAGS}, recorded)
    if recorded.get("padded_vocab_size") is not None:  # read_checkpoint gives the true size; this only fails early
        check_vocabulary(int(recorded["padded_vocab_size"]), tokenizer.vocab_size, recorded, args.load)
    return tokenizer, recorded


def load_from_flags(args, tokenizer, adaptor_kernels: Optional[object] = None) -> LoadedModel:
    """Join the process group (torchrun's, or one of a single process), then load the checkpoint of the flags
    sharded over this rank's tensor-parallel group. `adaptor_kernels`: a device adaptor's (deepspeed_npu's)."""
    from megatron.parallel_state import initialize_distributed  # imports DeepSpeed: only once the flags are checked

    dtype = _dtype(args)
    initialize_distributed(args.distributed_backend or device.communication_backend(), args.distributed_timeout_minutes)
    parallel = ParallelState(args.tensor_model_parallel_size, 1)
    model, checkpoint = load_model(args.load, iteration=args.iteration, tokenizer_vocab_size=tokenizer.vocab_size,
                                   parallel_state=parallel, dtype=dtype, device=device.current_device(),
                                   kernels=select_kernels(device.device_name(), adaptor_kernels))
    return LoadedModel(model, tokenizer, parallel, checkpoint)
