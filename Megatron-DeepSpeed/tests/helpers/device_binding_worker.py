"""One rank of test_device_binding.py: trains a tiny model for one step on a stand-in accelerator with numbered
devices, and writes down, in order, which device each rank bound and which was current at each seeding and each
collective. `python device_binding_worker.py EVENTS_FILE pretrain flags...`, under torchrun-like variables.

The stand-ins go in through the extension points torch and DeepSpeed document (DeepSpeed's set_accelerator,
torch.distributed's Backend.register_backend); the trainer runs unchanged.
"""
import json
import sys

import torch.distributed as dist
from deepspeed.accelerator import set_accelerator
from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

BACKEND = "gloo_recording"
# The Python-side collective names a ProcessGroup subclass overrides, and gloo's method for each.
GLOO_METHODS = {"allreduce": "allreduce", "allreduce_coalesced": "allreduce_coalesced", "broadcast": "broadcast",
                "allgather": "allgather", "all_gather_single": "_allgather_base", "reduce_scatter": "reduce_scatter",
                "reduce_scatter_single": "_reduce_scatter_base", "all_to_all_single": "alltoall_base",
                "gather": "gather", "scatter": "scatter", "reduce": "reduce", "alltoall": "alltoall",
                "barrier": "barrier", "send": "send", "recv": "recv"}


class NumberedCpuAccelerator(CPU_Accelerator):
    """A CPU whose devices are numbered like GPUs: it keeps the current one (0 until set_device, as CUDA and
    torch_npu do), which the communication backend reads at every collective."""

    def __init__(self, events: list):
        super().__init__()
        self.current = 0
        self.events = events

    def set_device(self, device_index):
        self.current = int(device_index)
        self.events.append(["set_device", self.current])

    def current_device(self):
        return self.current

    def communication_backend_name(self):
        return BACKEND

    def manual_seed_all(self, seed):
        self.events.append(["seed", self.current])
        super().manual_seed_all(seed)


ACCELERATOR = NumberedCpuAccelerator([])


class RecordingGloo(dist.ProcessGroup):
    """gloo in every collective, each first recorded with the device current at that moment."""

    def __init__(self, store, rank: int, size: int, timeout):
        super().__init__(rank, size)
        self._gloo = dist.ProcessGroupGloo(store, rank, size, timeout)

    def getBackendName(self):
        return BACKEND


def _recorded(name: str, gloo_method: str):
    def collective(self, *args, **kwargs):
        ACCELERATOR.events.append(["collective", name, ACCELERATOR.current])
        return getattr(self._gloo, gloo_method)(*args, **kwargs)
    return collective


for _name, _method in GLOO_METHODS.items():
    setattr(RecordingGloo, _name, _recorded(_name, _method))


def main(events_file: str, argv: list) -> None:
    dist.Backend.register_backend(BACKEND, RecordingGloo, devices=["cpu"])
    set_accelerator(ACCELERATOR)
    from megatron.model.provider import model_provider
    from megatron.training.loop import pretrain
    try:
        pretrain(model_provider, argv)
    finally:
        with open(events_file, "w") as out:
            json.dump(ACCELERATOR.events, out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
