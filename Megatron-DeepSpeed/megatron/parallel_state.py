"""Which processes work together: the tensor-, data- and pipeline-parallel groups of this process.

Rank layout (docs/ARCHITECTURE.md, Rank layout): tensor-parallel innermost, then DeepSpeed-Ulysses sequence
parallel (SP), then data, then pipeline:
    global rank = ((pp_rank * DP + dp_rank) * SP + sp_rank) * TP + tp_rank
which at SP 1 is DeepSpeed's PipeModelDataParallelTopology(num_pp, num_mp=TP, num_dp), so our groups and the ones
the DeepSpeed pipeline engine builds agree, and at TP = PP = 1 upstream main's layout (consecutive ranks share a
sequence). Tensor-parallel neighbours are adjacent ranks, hence on one node.

One ParallelState object owns the groups (no module-level state) and is itself the `mpu` that
deepspeed.initialize(mpu=...) expects.
"""
import itertools
import os
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable, List, Optional, Tuple

import torch.distributed as dist

from megatron import device
from megatron.errors import EXIT_BAD_INPUT, InputError


@dataclass(frozen=True)
class RankLayout:
    """The arithmetic of the rank layout, independent of any running process group."""
    tensor: int
    data: int
    pipeline: int
    sequence: int = 1  # DeepSpeed-Ulysses sequence-parallel size (--ds-sequence-parallel-size)

    @classmethod
    def for_world(cls, world_size: int, tensor_parallel_size: int, pipeline_parallel_size: int,
                  sequence_parallel_size: int = 1) -> "RankLayout":
        for flag, value in (("--tensor-model-parallel-size", tensor_parallel_size),
                            ("--pipeline-model-parallel-size", pipeline_parallel_size),
                            ("--ds-sequence-parallel-size", sequence_parallel_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InputError(f"{flag} is {value!r}; it must be a positive integer")
        model_parallel = tensor_parallel_size * pipeline_parallel_size * sequence_parallel_size
        if world_size % model_parallel:
            sequence = f" x --ds-sequence-parallel-size {sequence_parallel_size}" if sequence_parallel_size > 1 else ""
            raise InputError(
                f"--tensor-model-parallel-size {tensor_parallel_size} x --pipeline-model-parallel-size "
                f"{pipeline_parallel_size}{sequence} = {model_parallel} does not divide the number of processes "
                f"{world_size}; choose sizes whose product divides {world_size} (the rest is data parallelism)")
        return cls(tensor_parallel_size, world_size // model_parallel, pipeline_parallel_size, sequence_parallel_size)

    @property
    def world_size(self) -> int:
        return self.tensor * self.data * self.pipeline * self.sequence

    def global_rank(self, pp_rank: int, dp_rank: int, tp_rank: int, sp_rank: int = 0) -> int:
        return ((pp_rank * self.data + dp_rank) * self.sequence + sp_rank) * self.tensor + tp_rank

    def coordinates(self, rank: int) -> Tuple[int, int, int]:
        """(pp_rank, dp_rank, tp_rank) of a global rank."""
        return (rank // (self.data * self.sequence * self.tensor), (rank // (self.sequence * self.tensor)) % self.data,
                rank % self.tensor)

    def sequence_rank(self, rank: int) -> int:
        """Which chunk of each sequence a global rank holds."""
        return (rank // self.tensor) % self.sequence

    def _ranks(self, varying: str) -> List[List[int]]:
        """The groups of ranks that differ only in the `varying` coordinates (a string of p, d, s, t)."""
        sizes = {"p": self.pipeline, "d": self.data, "s": self.sequence, "t": self.tensor}
        fixed = [axis for axis in "pdst" if axis not in varying]
        groups = []
        for fixed_values in itertools.product(*(range(sizes[axis]) for axis in fixed)):
            group = []
            for varying_values in itertools.product(*(range(sizes[axis]) for axis in varying)):
                at = {**dict(zip(fixed, fixed_values)), **dict(zip(varying, varying_values))}
                group.append(self.global_rank(at["p"], at["d"], at["t"], at["s"]))
            groups.append(sorted(group))
        return groups

    def tensor_groups(self) -> List[List[int]]:
        return self._ranks("t")

    def data_groups(self) -> List[List[int]]:
        return self._ranks("d")

    def pipeline_groups(self) -> List[List[int]]:
        return self._ranks("p")

    def sequence_groups(self) -> List[List[int]]:
        return self._ranks("s")

    def sequence_data_groups(self) -> List[List[int]]:
        """The ranks ZeRO partitions over and DeepSpeed reduces gradients over: data and sequence parallel."""
        return self._ranks("ds")

    def model_groups(self) -> List[List[int]]:
        """One per data- and sequence-parallel position: every TP x PP rank that together holds one copy of the
        model."""
        return self._ranks("pt")


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
        self.pp_rank, self.dp_rank, self.tp_rank = self.layout.coordinates(self.rank)
        self.sp_rank = self.layout.sequence_rank(self.rank)
        self._timeout = timeout
        # Every process must take part in creating every group, in the same order.
        self._tensor_group, self._tensor_ranks = self._new_groups(self.layout.tensor_groups())
        self._data_group, self._data_ranks = self._new_groups(self.layout.data_groups())
        self._pipeline_group, self._pipeline_ranks = self._new_groups(self.layout.pipeline_groups())
        self._model_group, self._model_ranks = self._new_groups(self.layout.model_groups())
        # Without Ulysses the sequence-data-parallel group is the data-parallel group (as upstream's), and no
        # sequence group is made: DeepSpeed asks for one only above size 1.
        self._sequence_group = self._sequence_data_group = None
        self._sequence_data_ranks = self._data_ranks
        if sequence_parallel_size > 1:
            self._sequence_group, _ = self._new_groups(self.layout.sequence_groups())
            self._sequence_data_group, self._sequence_data_ranks = self._new_groups(
                self.layout.sequence_data_groups())

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
