"""Named random streams for dropout under tensor parallelism, and activation recomputation that replays them.

Tensor-parallel ranks run the same code on different shards. Dropout on a replicated tensor must draw the SAME
mask on every rank (or the replicas drift apart), so it uses the default generator, seeded identically on all
TP ranks. Dropout on a sharded tensor (attention probabilities of this rank's heads, or this rank's sequence
chunk) must draw DIFFERENT masks per rank, so it runs inside `tracker.fork()`, which swaps in a stream seeded
per TP rank and swaps the default back afterwards. States go through the accelerator, whose generator is the
one dropout on its tensors draws from (torch's CPU generator on CPU).
"""
import contextlib
from typing import Dict

import torch
from torch.utils.checkpoint import checkpoint

from megatron import device

MODEL_PARALLEL_RNG = "model-parallel"
MODEL_PARALLEL_SEED_OFFSET = 2718  # Megatron's offset, so the streams match Megatron's for the same --seed


class RNGStatesTracker:
    """Generator states by name; `fork(name)` draws from one of them instead of the default stream."""

    def __init__(self):
        self._states: Dict[str, torch.Tensor] = {}

    def add(self, name: str, seed: int) -> None:
        if name in self._states:
            raise ValueError(f"random stream {name!r} already exists")
        accelerator = device.accelerator()
        default_state = accelerator.get_rng_state()
        accelerator.manual_seed(seed)
        self._states[name] = accelerator.get_rng_state()
        accelerator.set_rng_state(default_state)

    def get_states(self) -> Dict[str, torch.Tensor]:
        """Copies of every stream's state, e.g. for a checkpoint."""
        return {name: state.clone() for name, state in self._states.items()}

    def set_states(self, states: Dict[str, torch.Tensor]) -> None:
        self._states = {name: state.clone() for name, state in states.items()}

    @contextlib.contextmanager
    def fork(self, name: str = MODEL_PARALLEL_RNG):
        """Inside the block random ops draw from stream `name`; it advances, the default stream does not."""
        if name not in self._states:
            raise KeyError(f"random stream {name!r} was never added; known: {sorted(self._states)}")
        accelerator = device.accelerator()
        default_state = accelerator.get_rng_state()
        accelerator.set_rng_state(self._states[name])
        try:
            yield
        finally:
            self._states[name] = accelerator.get_rng_state()
            accelerator.set_rng_state(default_state)

    def checkpoint(self, function, *args):
        """function(*args) keeping only its inputs; it is recomputed in backward with torch's generators AND
        this tracker's streams rewound to where the forward found them, so dropout masks come out identical.
        Under torch.compile the compiled graph keeps recomputed random ops equal to the forward's itself (its
        partitioner saves their outputs or replays their RNG state), and dynamo takes no context manager as a
        checkpoint's context_fn: there the plain checkpoint is the same computation."""
        if torch.compiler.is_compiling():
            return checkpoint(function, *args, use_reentrant=False)
        states_at_forward = {}

        @contextlib.contextmanager
        def remember_states():
            states_at_forward.update(self.get_states())
            yield

        @contextlib.contextmanager
        def replay_states():
            states_after_forward = self.get_states()
            self.set_states(states_at_forward)
            try:
                yield
            finally:
                self.set_states(states_after_forward)

        return checkpoint(function, *args, use_reentrant=False,
                          context_fn=lambda: (remember_states(), replay_states()))


def tensor_parallel_rng_tracker(seed: int, tensor_parallel_rank: int) -> RNGStatesTracker:
    """A tracker with the model-parallel stream seeded as Megatron does (seed + 2718 + TP rank). The default
    stream is left alone: it is the one device.manual_seed(seed) set, identical on all TP ranks."""
    tracker = RNGStatesTracker()
    tracker.add(MODEL_PARALLEL_RNG, seed + MODEL_PARALLEL_SEED_OFFSET + tensor_parallel_rank)
    return tracker
