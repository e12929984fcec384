"""A CPU process-group backend with nccl's all_gather_into_tensor, for testing tensor parallelism with experts.

DeepSpeed's MoE layer gathers its expert outputs over the tensor-parallel ranks into a flat 1-D buffer
(deepspeed/moe/mappings.py, `_gather_tokens`). nccl and hccl take any output of the right number of elements;
gloo takes only an output shaped as the inputs stacked on dim 0, so over plain gloo TP x EP cannot run on CPU.
This backend, registered with torch's documented extension point (`Backend.register_backend`), is gloo in every
collective and differs only there: it views a flat output as the stacked shape before handing it to gloo. Nothing
in torch, DeepSpeed or the project is replaced; a test that initialises its ranks with BACKEND gets it.
"""
import torch.distributed as dist

BACKEND = "gloo_flat_gather"


class FlatGatherGloo(dist.ProcessGroup):
    """Every collective of a real ProcessGroupGloo; all_gather_into_tensor also into a flat output."""

    def __init__(self, store, rank: int, size: int, timeout):
        super().__init__(rank, size)
        self._gloo = dist.ProcessGroupGloo(store, rank, size, timeout)

    def getBackendName(self):
        return BACKEND

    def all_gather_single(self, output, input, *args, **kwargs):
        stacked = output.view(self.size() * input.shape[0], *input.shape[1:]) if input.dim() > 1 else output
        return self._gloo._allgather_base(stacked, input, *args, **kwargs)

    def reduce_scatter_single(self, *args, **kwargs):
        return self._gloo._reduce_scatter_base(*args, **kwargs)

    def all_to_all_single(self, *args, **kwargs):
        return self._gloo.alltoall_base(*args, **kwargs)

    def allreduce(self, *args, **kwargs):
        return self._gloo.allreduce(*args, **kwargs)

    def allreduce_coalesced(self, *args, **kwargs):
        return self._gloo.allreduce_coalesced(*args, **kwargs)

    def broadcast(self, *args, **kwargs):
        return self._gloo.broadcast(*args, **kwargs)

    def allgather(self, *args, **kwargs):
        return self._gloo.allgather(*args, **kwargs)

    def reduce_scatter(self, *args, **kwargs):
        return self._gloo.reduce_scatter(*args, **kwargs)

    def gather(self, *args, **kwargs):
        return self._gloo.gather(*args, **kwargs)

    def scatter(self, *args, **kwargs):
        return self._gloo.scatter(*args, **kwargs)

    def reduce(self, *args, **kwargs):
        return self._gloo.reduce(*args, **kwargs)

    def alltoall(self, *args, **kwargs):
        return self._gloo.alltoall(*args, **kwargs)

    def barrier(self, *args, **kwargs):
        return self._gloo.barrier(*args, **kwargs)

    def send(self, *args, **kwargs):
        return self._gloo.send(*args, **kwargs)

    def recv(self, *args, **kwargs):
        return self._gloo.recv(*args, **kwargs)


def register() -> None:
    """Make BACKEND known to torch.distributed in this process (once)."""
    if BACKEND not in dist.Backend.backend_list:
        dist.Backend.register_backend(BACKEND, FlatGatherGloo, devices=["cpu"])
