"""What the generation and zero-shot evaluation command lines share: turning their flags (megatron/config/flags/
inference.py: which checkpoint, how to split it over processes, which tokenizer and precision) into a loaded
model. Launch like training: `torchrun --nproc_per_node N tool.py ...`; the ranks beyond the tensor-parallel
size form data-parallel replicas that share the work.
"""
from dataclasses import dataclass
from typing import Optional

import torch

from megatron import device
from megatron.checkpoint.formats.checkpoint import Checkpoint
from megatron.config.recorded_flags import RecordedFlags
from megatron.config.flags import inference as inference_flags
from megatron.errors import InputError
from megatron.inference.loading import (TOKENIZER_FLAGS, build_checkpoint_tokenizer, check_vocabulary, load_model,
                                        recorded_flags)
from megatron.model.gpt import GPTModel
from megatron.model.kernels import select_kernels
from megatron.parallel_state import ParallelState


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


def check_model_shape(args, recorded) -> None:
    """InputError naming the first model-shape flag given with another value than the checkpoint records."""
    for name in args.model_shape_flags:
        given = getattr(args, name)
        if given is not None and recorded.get(name) is not None and given != int(recorded[name]):
            raise InputError(f"--{name.replace('_', '-')} {given} differs from the checkpoint's {recorded[name]} "
                             f"(--load {args.load}); give the checkpoint's value or drop the flag")


def tokenizer_from_flags(args):
    """(tokenizer, the checkpoint's recorded flags): the tokenizer flags given, each missing one as the model was
    trained. Cheap, so that prompts and data can be checked before the model is loaded."""
    inference_flags.validate(vars(args))
    recorded = recorded_flags(args.load, args.iteration)
    check_model_shape(args, recorded)
    tokenizer = build_checkpoint_tokenizer({name: getattr(args, name) for name in TOKENIZER_FLAGS}, recorded)
    rows = RecordedFlags.of(recorded).padded_vocab_size
    if rows is not None:  # read_checkpoint gives the true size; this only fails early
        check_vocabulary(rows, tokenizer.vocab_size, recorded, args.load)
    return tokenizer, recorded


def load_from_flags(args, tokenizer, adaptor_kernels: Optional[object] = None) -> LoadedModel:
    """Join the process group (torchrun's, or one of a single process), then load the checkpoint of the flags
    sharded over this rank's tensor-parallel group. `adaptor_kernels`: a device adaptor's (deepspeed_npu's), of which
    only those documented for inference are used."""
    from megatron.parallel_state import initialize_distributed  # imports DeepSpeed: only once the flags are checked

    initialize_distributed(args.distributed_backend or device.communication_backend(), args.distributed_timeout_minutes)
    dtype = _dtype(args)  # asks the device (on CUDA it may make a tensor there): after this rank's device is bound
    parallel = ParallelState(args.tensor_model_parallel_size, 1)
    model, checkpoint = load_model(args.load, iteration=args.iteration, tokenizer_vocab_size=tokenizer.vocab_size,
                                   parallel_state=parallel, dtype=dtype, device=device.current_device(),
                                   kernels=select_kernels(device.device_name(), adaptor_kernels, training=False))
    return LoadedModel(model, tokenizer, parallel, checkpoint)
