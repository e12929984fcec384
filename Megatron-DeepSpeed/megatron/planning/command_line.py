"""The layout planner's estimate for a pretrain_gpt.py command line, as the trainer would run it on a device: the
flags parsed and validated as the trainer validates them, the tokenizer's vocabulary, the device's loss chunk.
Tools that measure training (tools/device_check.sh's speed grid, tools/benchmark_planner_memory.py) set this figure
beside the peak they measure."""
from dataclasses import replace
from typing import Callable, Optional, Sequence

from megatron.config.arguments import parse_args, validate_args
from megatron.device_probe import DeviceFacts
from megatron.model.kernels import repeats_grouped_kv, select_kernels
from megatron.planning.memory import FRAGMENTATION, MemoryEstimate, estimate_memory
from megatron.planning.shape import from_flags
from megatron.tokenizer import build_tokenizer


def planned_memory(argv: Sequence[str], world_size: int, device_name: str,
                   fragmentation: float = FRAGMENTATION, attention: Optional[Callable] = None) -> MemoryEstimate:
    """The planner's memory per device for `pretrain_gpt.py argv` on `world_size` devices named `device_name`
    ('cpu', 'cuda', 'npu'), training with `attention` (None: the device's own kernel; an adaptor's, such as the
    Ascend fusion attention, keeps grouped K/V unrepeated); fragmentation=0 gives what the allocator's
    max_memory_allocated would count."""
    flags = validate_args(parse_args(list(argv)), world_size, device_name)
    vocab_size = build_tokenizer(flags.tokenizer_type, vocab_file=flags.vocab_file, merge_file=flags.merge_file,
                                 tokenizer_model=flags.tokenizer_model, vocab_size=flags.vocab_size).vocab_size
    shape, layout, settings = from_flags(flags, vocab_size)
    kernels = select_kernels(device_name)
    settings = replace(settings, loss_chunk_bytes=kernels.loss_chunk_bytes,
                       kv_repeated=repeats_grouped_kv(attention or kernels.attention))
    return estimate_memory(shape, layout, settings, fragmentation=fragmentation)


def with_kernel_answers(facts: DeviceFacts, adaptor_kernels: Optional[object]) -> DeviceFacts:
    """`facts` with whether the attention kernel the trainer picks on this device (with `adaptor_kernels`, an
    adaptor's, as the trainer is given them) gets grouped K/V repeated, for the launcher's memory estimate. Asked
    in the launcher's device child: naming an NPU's chip opens a device."""
    if facts.count == 0:
        return facts
    return replace(facts, kv_repeated=repeats_grouped_kv(select_kernels(facts.name, adaptor_kernels).attention))
