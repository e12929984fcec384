"""Which processes work together: the tensor-, data- and pipeline-parallel groups of this process.

Rank layout (docs/ARCHITECTURE.md, Rank layout): the named axes of AXES, tensor-parallel innermost, then
DeepSpeed-Ulysses sequence parallel (SP), then data, then pipeline:
    global rank = ((pp_rank * DP + dp_rank) * SP + sp_rank) * TP + tp_rank
which at SP 1 is DeepSpeed's PipeModelDataParallelTopology(num_pp, num_mp=TP, num_dp), so our groups and the ones
the DeepSpeed pipeline engine builds agree, and at TP = PP = 1 upstream main's layout (consecutive ranks share a
sequence). Tensor-parallel neighbours are adjacent ranks, hence on one node.

One ParallelState object owns the groups (no module-level state) and is itself the `mpu` that
deepspeed.initialize(mpu=...) expects.
"""
import itertools
import math
import os
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable, Dict, List, Optional, Tuple

import torch.distributed as dist

from megatron import device
from megatron.errors import EXIT_BAD_INPUT, InputError


# The parallel axes, outermost first: a rank's coordinates are the digits of its global rank in this order, the
# tensor axis varying fastest (upstream main's order). A new axis (e.g. context parallelism) is a new name here, its
# size flag, the groups that span it (GROUPS) and the code that uses them.
AXES = ("pipeline", "data", "sequence", "tensor")
SIZE_FLAGS = {"tensor": "--tensor-model-parallel-size", "pipeline": "--pipeline-model-parallel-size",
              "sequence": "--ds-sequence-parallel-size"}  # the data-parallel size is what remains of the world
# The process groups, each by the axes its ranks differ in: "model" holds one copy of the model (every TP x PP rank
# of one data- and sequence-parallel position); "sequence_data" is what ZeRO partitions and DeepSpeed reduces over.
GROUPS = {"tensor": ("tensor",), "data": ("data",), "pipeline": ("pipeline",), "model": ("pipeline", "tensor"),
          "sequence": ("sequence",), "sequence_data": ("data", "sequence")}


@dataclass(frozen=True)
class RankLayout:
    """The arithmetic of the rank layout over AXES, independent of any running process group."""
    tensor: int
    data: int
    pipeline: int
    sequence: int = 1  # DeepSpeed-Ulysses sequence-parallel size (--ds-sequence-parallel-size)

    @classmethod
    def for_world(cls, world_size: int, tensor_parallel_size: int, pipeline_parallel_size: int,
                  sequence_parallel_size: int = 1) -> "RankLayout":
        sizes = {"tensor": tensor_parallel_size, "pipeline": pipeline_parallel_size,
                 "sequence": sequence_parallel_size}
        for axis, value in sizes.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InputError(f"{SIZE_FLAGS[axis]} is {value!r}; it must be a positive integer")
        model_parallel = math.prod(sizes.values())
        if world_size % model_parallel:
            product = " x ".join(f"{SIZE_FLAGS[axis]} {size}" for axis, size in sizes.items()
                                 if axis != "sequence" or size > 1)
            raise InputError(f"{product} = {model_parallel} does not divide the number of processes {world_size}; "
                             f"choose sizes whose product divides {world_size} (the rest is data parallelism)")
        return cls(data=world_size // model_parallel, **sizes)

    def size(self, axis: str) -> int:
        return getattr(self, axis)

    @property
    def world_size(self) -> int:
        return math.prod(self.size(axis) for axis in AXES)

    def global_rank(self, **coordinates: int) -> int:
        """The rank at these coordinates (by axis name; an axis not given is at 0)."""
        rank = 0
        for axis in AXES:
            rank = rank * self.size(axis) + coordinates.get(axis, 0)
        return rank

    def coordinates(self, rank: int) -> Dict[str, int]:
        """A global rank's position on every axis."""
        position = {}
        for axis in reversed(AXES):
            rank, position[axis] = divmod(rank, self.size(axis))
        return {axis: position[axis] for axis in AXES}

    def groups(self, name: str) -> List[List[int]]:
        """The rank lists of the GROUPS entry `name`: ranks that differ only in its axes."""
        varying = GROUPS[name]
        fixed = [axis for axis in AXES if axis not in varying]
        groups = []
        for fixed_values in itertools.product(*(range(self.size(axis)) for axis in fixed)):
            at = dict(zip(fixed, fixed_values))
            groups.append(sorted(self.global_rank(**at, **dict(zip(varying, values)))
                                 for values in itertools.product(*(range(self.size(axis)) for axis in varying))))
        return groups


class ParallelState:
    """This process's groups and ranks; also the `mpu` object DeepSpeed queries (method names are DeepSpeed's
    and Megatron's, which is why they are long)."""

    def __init__(self, tensor_parallel_size: int = 1, pipeline_parallel_size: int = 1,
                 timeout: Optional[timedelta] = None, sequence_parallel_size: int = 1):
        """`timeout`: how long a collective in these groups waits for a peer (torch's default when None);
        `sequence_parallel_size`: DeepSpeed-Ulysses ranks sharing each sequence (model/ulysses.py)."""
        if not dist.is_initialized():
            raise RuntimeError("ParallelState needs torch.distributed to be initialized first "
                               "(init_process_group / deepspeed.init_distributed)")
        self.layout = RankLayout.for_world(dist.get_world_size(), tensor_parallel_size, pipeline_parallel_size,
                                           sequence_parallel_size)
        self.rank = dist.get_rank()
        at = self.layout.coordinates(self.rank)
        self.pp_rank, self.dp_rank, self.tp_rank, self.sp_rank = (at[axis] for axis in ("pipeline", "data", "tensor",
                                                                                       "sequence"))
        self._timeout = timeout
        # Every process must take part in creating every group, in the same order.
        self._tensor_group, self._tensor_ranks = self._new_groups(self.layout.groups("tensor"))
        self._data_group, self._data_ranks = self._new_groups(self.layout.groups("data"))
        self._pipeline_group, self._pipeline_ranks = self._new_groups(self.layout.groups("pipeline"))
        self._model_group, self._model_ranks = self._new_groups(self.layout.groups("model"))
        # Without Ulysses the sequence-data-parallel group is the data-parallel group (as upstream's), and no
        # sequence group is made: DeepSpeed asks for one only above size 1.
        self._sequence_group = self._sequence_data_group = None
        self._sequence_data_ranks = self._data_ranks
        if sequence_parallel_size > 1:
            self._sequence_group, _ = self._new_groups(self.layout.groups("sequence"))
            self._sequence_data_group, self._sequence_data_ranks = self._new_groups(self.layout.groups("sequence_data"))

    def _new_groups(self, rank_lists: List[List[int]]):
        group, _ = dist.new_subgroups_by_enumeration(rank_lists, timeout=self._timeout)
        mine = next(ranks for ranks in rank_lists if self.rank in ranks)
        return group, mine

    # --- tensor parallel ---------------------------------------------------------------------------------
    def get_tensor_model_parallel_group(self):
        return self._tensor_group

    def get_tensor_model_parallel_world_size(self) -> int:
        return self.layout.tensor

    def get_tensor_model_parallel_rank(self) -> int:
        return self.tp_rank

    def get_tensor_model_parallel_src_rank(self) -> int:
        """Global rank of tensor-parallel rank 0 in this group: the source when broadcasting the batch."""
        return self._tensor_ranks[0]

    # --- data parallel -----------------------------------------------------------------------------------
    def get_data_parallel_group(self):
        return self._data_group

    def get_data_parallel_world_size(self) -> int:
        return self.layout.data

    def get_data_parallel_rank(self) -> int:
        return self.dp_rank

    def get_data_parallel_group_ranks(self) -> List[int]:
        return list(self._data_ranks)

    # --- pipeline parallel -------------------------------------------------------------------------------
    def get_pipeline_model_parallel_group(self):
        return self._pipeline_group

    def get_pipeline_model_parallel_world_size(self) -> int:
        return self.layout.pipeline

    def get_pipeline_model_parallel_rank(self) -> int:
        return self.pp_rank

    def is_pipeline_first_stage(self) -> bool:
        return self.pp_rank == 0

    def is_pipeline_last_stage(self) -> bool:
        return self.pp_rank == self.layout.pipeline - 1

    # --- model parallel (TP x PP of one replica): DeepSpeed reduces grad norms and overflow flags here ----
    def get_model_parallel_group(self):
        return self._model_group

    def get_model_parallel_world_size(self) -> int:
        return self.layout.tensor * self.layout.pipeline

    def get_model_parallel_rank(self) -> int:
        """Position inside the replica; DeepSpeed names checkpoint files mp_rank_XX by it."""
        return self._model_ranks.index(self.rank)

    # --- DeepSpeed's names for the same groups -----------------------------------------------------------
    # DeepSpeed's pipeline grid calls the tensor-parallel group the "slice" group and the pipeline group "pipe".
    get_slice_parallel_group = get_tensor_model_parallel_group
    get_slice_parallel_world_size = get_tensor_model_parallel_world_size
    get_slice_parallel_rank = get_tensor_model_parallel_rank
    get_pipe_parallel_group = get_pipeline_model_parallel_group
    get_pipe_parallel_world_size = get_pipeline_model_parallel_world_size
    get_pipe_parallel_rank = get_pipeline_model_parallel_rank

    # --- DeepSpeed-Ulysses sequence parallel: the engine reduces gradients and ZeRO partitions over the
    # sequence-data-parallel group (deepspeed/utils/groups.py `_get_sequence_data_parallel_group`), dividing by the
    # data-parallel size only. Megatron's --sequence-parallel is another thing: it reuses the tensor group. We
    # deliberately define no `initialize_sequence_parallel`: its mere presence makes DeepSpeed ignore this mpu's
    # data-parallel and model-parallel groups (groups.py `_get_data_parallel_group`).
    def get_sequence_parallel_group(self):
        """The Ulysses group (None at size 1, where none exists and DeepSpeed asks for none)."""
        return self._sequence_group

    def get_sequence_parallel_world_size(self) -> int:
        return self.layout.sequence

    def get_sequence_parallel_rank(self) -> int:
        return self.sp_rank

    def get_sequence_data_parallel_group(self):
        return self._data_group if self.layout.sequence == 1 else self._sequence_data_group

    def get_sequence_data_parallel_world_size(self) -> int:
        return self.layout.data * self.layout.sequence

    def get_sequence_data_parallel_rank(self) -> int:
        return self._sequence_data_ranks.index(self.rank)

    def __repr__(self) -> str:
        return (f"ParallelState(rank={self.rank}, tp={self.tp_rank}/{self.layout.tensor}, "
                f"dp={self.dp_rank}/{self.layout.data}, pp={self.pp_rank}/{self.layout.pipeline}, "
                f"sp={self.sp_rank}/{self.layout.sequence})")


# HCCL's limits in seconds as CANN documents them (closed docs; not in torch_npu's sources): the connect timeout
# takes 120 to 7200; an execution timeout of 0 would mean "wait forever".
HCCL_CONNECT_TIMEOUT_RANGE = (120, 7200)


def hccl_timeouts(timeout_minutes: float) -> dict:
    """HCCL_EXEC_TIMEOUT and HCCL_CONNECT_TIMEOUT (seconds, as strings) from --distributed-timeout-minutes.

    torch_npu ends a rank whose collective waits longer than the process group's timeout (its watchdog), and
    asks for that timeout to exceed HCCL_EXEC_TIMEOUT so that HCCL reports the hang (and writes its log) first
    (torch_npu/csrc/distributed/ProcessGroupHCCL.cpp warns otherwise). So HCCL gets 90% of the flag's time,
    and every wait, such as ranks waiting while rank 0 builds the index cache, has one limit: the flag's."""
    seconds = max(1, int(timeout_minutes * 60) * 9 // 10)
    low, high = HCCL_CONNECT_TIMEOUT_RANGE
    return {"HCCL_EXEC_TIMEOUT": str(seconds), "HCCL_CONNECT_TIMEOUT": str(min(high, max(low, seconds)))}


def hccl_environment(timeout_minutes: float, environment) -> dict:
    """The HCCL timeout variables to set (those `environment` lacks); InputError where a value the user set would
    let torch's watchdog end a waiting rank before HCCL reports it."""
    limit = int(timeout_minutes * 60)
    user_value = environment.get("HCCL_EXEC_TIMEOUT")
    if user_value is not None:
        try:
            too_long = int(user_value) <= 0 or int(user_value) >= limit
        except ValueError:
            too_long = True
        if too_long:
            raise InputError(f"environment variable HCCL_EXEC_TIMEOUT={user_value!r} (seconds) is not a number "
                             f"below --distributed-timeout-minutes {timeout_minutes:g} ({limit} s), so torch's "
                             "watchdog would end a waiting rank before HCCL reports it; unset HCCL_EXEC_TIMEOUT "
                             "(it is derived from --distributed-timeout-minutes) or raise the flag")
    return {name: value for name, value in hccl_timeouts(timeout_minutes).items() if name not in environment}


def initialize_distributed(backend: str, timeout_minutes: float) -> None:
    """Bind this rank's own accelerator (device.bind_local_device), then join the process group set up by torchrun /
    the deepspeed launcher; a plain `python pretrain_gpt.py` becomes a group of one. A collective that waits for a peer longer than `timeout_minutes` fails; on hccl
    HCCL's own timeouts are set from the same value (hccl_timeouts) unless the environment has them."""
    if "RANK" not in os.environ:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            free_port = probe.getsockname()[1]
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=os.environ.get("MASTER_PORT", str(free_port)))
    if backend == "hccl":
        os.environ.update(hccl_environment(timeout_minutes, os.environ))
    device.bind_local_device()
    import deepspeed  # the engine only where a process group is joined: the rank arithmetic stays light
    deepspeed.init_distributed(dist_backend=backend, verbose=False, timeout=timedelta(minutes=timeout_minutes))


def first_rank_checks(check: Callable[[], None]) -> None:
    """Run the start-up `check` on global rank 0 only (one reader of the files, one line for the user) and stop
    every rank alike when it fails: rank 0 raises its InputError, the others exit with the same status without
    repeating the message."""
    error, failure = None, [None]
    if dist.get_rank() == 0:
        try:
            check()
        except InputError as err:
            error, failure = err, [str(err)]
    dist.broadcast_object_list(failure, src=0)
    if failure[0] is None:
        return
    if error is not None:
        raise error
    raise SystemExit(EXIT_BAD_INPUT)
