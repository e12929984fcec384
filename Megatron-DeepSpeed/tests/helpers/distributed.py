"""Run a test function on N real processes joined by torch.distributed over gloo on 127.0.0.1.

Children come from a forkserver that has already imported torch and DeepSpeed's accelerator, so a launch
costs a fork instead of a fresh interpreter: on a 2-core machine that is most of a test's time. Each rank
returns a picklable result (tensors included); a failing rank's traceback is raised in the test process and
the other ranks, which would otherwise wait forever in a collective, are stopped.
"""
import multiprocessing
import os
import pickle
import queue
import socket
import time
import traceback

from tests.helpers import flat_gather_backend

PRELOADED_MODULES = ["torch", "torch.distributed", "deepspeed", "deepspeed.runtime.zero.muon.muon_optimizer"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank_main(function, args, rank, world_size, port, results, backend):
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    for name, value in (("RANK", rank), ("WORLD_SIZE", world_size), ("LOCAL_RANK", rank)):
        os.environ[name] = str(value)
    try:
        import torch
        import torch.distributed as dist
        torch.set_num_threads(1)  # N ranks share 2 cores: more threads only add contention
        if backend == flat_gather_backend.BACKEND:
            flat_gather_backend.register()
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
        try:
            outcome = ("ok", function(*args))
        finally:
            dist.destroy_process_group()
    except BaseException:  # everything, so the test process reports it instead of timing out
        outcome = ("error", traceback.format_exc())
    # Plain pickle: tensors travel as bytes, not as shared-memory handles that die with this process.
    results.put((rank, pickle.dumps(outcome)))


def run_on_ranks(function, world_size: int, *args, timeout: float = 120.0, backend: str = "gloo") -> list:
    """function(*args) on ranks 0..world_size-1; returns their results ordered by rank. `backend` is gloo, or
    flat_gather_backend.BACKEND for what needs nccl's all_gather_into_tensor (tensor parallelism with experts).

    `function` must be importable by name (defined at module level) because it is pickled into the children.
    """
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOADED_MODULES)
    results = context.Queue()
    port = free_port()
    processes = [context.Process(target=_rank_main,
                                 args=(function, args, rank, world_size, port, results, backend))
                 for rank in range(world_size)]
    for process in processes:
        process.start()
    outcomes, finished, deadline = {}, False, time.monotonic() + timeout
    try:
        while len(outcomes) < world_size:
            try:
                rank, payload = results.get(timeout=1.0)
            except queue.Empty:
                missing = [rank for rank in range(world_size) if rank not in outcomes]
                crashed = [rank for rank in missing if processes[rank].exitcode not in (None, 0)]
                if crashed or time.monotonic() > deadline:
                    what = f"died (exit codes {[processes[r].exitcode for r in crashed]})" if crashed else \
                        f"gave no result within {timeout} s"
                    raise AssertionError(f"{function.__name__}: ranks {crashed or missing} {what}") from None
                continue
            status, value = pickle.loads(payload)
            if status == "error":
                raise AssertionError(f"{function.__name__} failed on rank {rank}:\n{value}")
            outcomes[rank] = value
        finished = True
    finally:
        for process in processes:
            process.join(timeout=10 if finished else 0)
            if process.is_alive():
                process.terminate()
                process.join()
    return [outcomes[rank] for rank in range(world_size)]


def join_group_of_one() -> None:
    """This test process as the one rank of a gloo process group, for the code whose collectives a single rank
    runs too (tests/conftest.py ends the group after the test)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
