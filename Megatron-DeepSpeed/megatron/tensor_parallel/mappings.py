"""Every communication tensor parallelism needs, as named autograd functions whose backward is the adjoint
of their forward (all-reduce <-> identity, all-gather <-> reduce-scatter, scatter <-> gather).

Naming the pairs keeps the parallel layers free of raw collectives: reading a layer tells which region a
tensor enters or leaves. "Tensor-parallel region" functions split or join the LAST dim (hidden features);
"sequence-parallel region" functions the SEQUENCE dim, dim 1 of our batch-first [batch, seq, hidden] tensors.
With one rank in the group every function is the identity.
"""
import torch
import torch.distributed as dist

from megatron.errors import InputError

SEQUENCE_DIM = 1


def _all_reduce(tensor, group):
    if dist.get_world_size(group) == 1:
        return tensor
    reduced = tensor.contiguous().clone()  # never overwrite a tensor autograd may still need
    dist.all_reduce(reduced, group=group)
    return reduced


def _chunk_size(tensor, dim, group):
    world_size = dist.get_world_size(group)
    if tensor.shape[dim] % world_size:
        what, fix = (("sequence length", "with --sequence-parallel choose a --seq-length divisible by it")
                     if dim == SEQUENCE_DIM else ("feature count", "choose model sizes divisible by it"))
        raise InputError(f"{what} {tensor.shape[dim]} (tensor shape {tuple(tensor.shape)}) is not divisible by "
                         f"--tensor-model-parallel-size {world_size}; {fix}")
    return tensor.shape[dim] // world_size


def _split(tensor, dim, group):
    """This rank's chunk of `dim`."""
    if dist.get_world_size(group) == 1:
        return tensor
    size = _chunk_size(tensor, dim, group)
    return tensor.narrow(dim, dist.get_rank(group) * size, size).contiguous()


def _all_gather(tensor, dim, group):
    """Chunks of all ranks concatenated along `dim`, in rank order."""
    world_size = dist.get_world_size(group)
    if world_size == 1:
        return tensor
    # The collective concatenates along dim 0 of contiguous buffers, so move `dim` there and back.
    local = tensor.movedim(dim, 0).contiguous()
    gathered = torch.empty((world_size * local.shape[0], *local.shape[1:]), dtype=local.dtype, device=local.device)
    dist.all_gather_single(gathered, local, group=group)
    return gathered.movedim(0, dim).contiguous()


def _reduce_scatter(tensor, dim, group):
    """Sum over ranks, of which this rank keeps its chunk of `dim`."""
    world_size = dist.get_world_size(group)
    if world_size == 1:
        return tensor
    size = _chunk_size(tensor, dim, group)
    full = tensor.movedim(dim, 0).contiguous()
    local = torch.empty((size, *full.shape[1:]), dtype=full.dtype, device=full.device)
    dist.reduce_scatter_single(local, full, group=group)
    return local.movedim(0, dim).contiguous()


class _CopyToTensorParallelRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, group):
        ctx.group = group
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad, ctx.group), None


class _ReduceFromTensorParallelRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, group):
        return _all_reduce(tensor, group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _ScatterToTensorParallelRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, group):
        ctx.group = group
        return _split(tensor, -1, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather(grad, -1, ctx.group), None


class _GatherFromTensorParallelRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, group):
        ctx.group = group
        return _all_gather(tensor, -1, group)

    @staticmethod
    def backward(ctx, grad):
        return _split(grad, -1, ctx.group), None


class _ScatterToSequenceParallelRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, group):
        ctx.group = group
        return _split(tensor, SEQUENCE_DIM, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather(grad, SEQUENCE_DIM, ctx.group), None


class _GatherFromSequenceParallelRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, group):
        ctx.group = group
        return _all_gather(tensor, SEQUENCE_DIM, group)

    @staticmethod
    def backward(ctx, grad):
        # What follows is tensor-parallel, so each rank holds a partial gradient for every position.
        return _reduce_scatter(grad, SEQUENCE_DIM, ctx.group), None


class _ReduceScatterToSequenceParallelRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, group):
        ctx.group = group
        return _reduce_scatter(tensor, SEQUENCE_DIM, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather(grad, SEQUENCE_DIM, ctx.group), None


def summed_over_ranks(tensor, group):
    """`tensor` summed over `group`, as a new tensor: the gradient hook of a replicated parameter each rank applies
    to its own part of the work (its heads), whose full gradient is the sum of the ranks'."""
    return _all_reduce(tensor, group)


def copy_to_tensor_parallel_region(tensor, group):
    """Enter a TP region with a replicated tensor: forward identity, backward all-reduce of the partial grads."""
    return _CopyToTensorParallelRegion.apply(tensor, group)


def reduce_from_tensor_parallel_region(tensor, group):
    """Leave a TP region by summing the partial results: forward all-reduce, backward identity."""
    return _ReduceFromTensorParallelRegion.apply(tensor, group)


def scatter_to_tensor_parallel_region(tensor, group):
    """Keep this rank's chunk of the last dim: forward split, backward all-gather."""
    return _ScatterToTensorParallelRegion.apply(tensor, group)


def gather_from_tensor_parallel_region(tensor, group):
    """Join the ranks' chunks of the last dim: forward all-gather, backward split."""
    return _GatherFromTensorParallelRegion.apply(tensor, group)


def scatter_to_sequence_parallel_region(tensor, group):
    """Keep this rank's chunk of the sequence: forward split, backward all-gather."""
    return _ScatterToSequenceParallelRegion.apply(tensor, group)


def gather_from_sequence_parallel_region(tensor, group):
    """Enter a TP region from sequence-parallel chunks: forward all-gather along the sequence, backward
    reduce-scatter (sum the partial grads and hand each rank its chunk)."""
    return _GatherFromSequenceParallelRegion.apply(tensor, group)


def reduce_scatter_to_sequence_parallel_region(tensor, group):
    """Leave a TP region into sequence-parallel chunks: forward reduce-scatter along the sequence, backward
    all-gather."""
    return _ReduceScatterToSequenceParallelRegion.apply(tensor, group)
