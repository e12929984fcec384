"""--deepspeed-activation-checkpointing: recompute through deepspeed.checkpointing instead of torch's.

DeepSpeed's checkpoint rewinds the random streams of ITS tracker (plus torch's default generators) before it
recomputes a chunk. So the model-parallel stream that tensor-parallel dropout draws from must live in that
tracker, or recomputed dropout masks would differ from the forward's. DeepSpeedRNGTracker gives DeepSpeed's
tracker the interface of random.RNGStatesTracker, and the model takes it in that one's place.
"""
from typing import Dict

import torch
from deepspeed import checkpointing

from megatron.config.job import ActivationCheckpointingConfig
from megatron.tensor_parallel.random import MODEL_PARALLEL_RNG, MODEL_PARALLEL_SEED_OFFSET


class DeepSpeedRNGTracker:
    """RNGStatesTracker's interface over deepspeed.checkpointing's process-wide tracker."""

    def __init__(self):
        self._tracker = checkpointing.get_cuda_rng_tracker()

    def add(self, name: str, seed: int) -> None:
        self._tracker.add(name, seed)

    def get_states(self) -> Dict[str, torch.Tensor]:
        return {name: state.clone() for name, state in self._tracker.get_states().items()}

    def set_states(self, states: Dict[str, torch.Tensor]) -> None:
        self._tracker.set_states({name: state.clone() for name, state in states.items()})

    def fork(self, name: str = MODEL_PARALLEL_RNG):
        return self._tracker.fork(name)

    @staticmethod
    def checkpoint(function, *args):
        """function(*args) recomputed in backward by DeepSpeed, with every stream rewound."""
        return checkpointing.checkpoint(function, *args)


def deepspeed_checkpointing_rng_tracker(seed: int, parallel_state, num_checkpoints: int,
                                        options: ActivationCheckpointingConfig) -> DeepSpeedRNGTracker:
    """Configure deepspeed.checkpointing for this process (`num_checkpoints`: recomputed chunks per forward,
    which its contiguous buffers are sized for) and return its tracker, reset, with the model-parallel stream
    seeded as tensor_parallel_rng_tracker seeds it."""
    checkpointing.configure(parallel_state, partition_activations=options.partition_activations,
                            contiguous_checkpointing=options.contiguous_checkpointing,
                            num_checkpoints=num_checkpoints, checkpoint_in_cpu=options.checkpoint_in_cpu,
                            synchronize=options.synchronize, profile=options.profile)
    tracker = DeepSpeedRNGTracker()
    checkpointing.get_cuda_rng_tracker().reset()
    tracker.add(MODEL_PARALLEL_RNG, seed + MODEL_PARALLEL_SEED_OFFSET + parallel_state.get_tensor_model_parallel_rank())
    return tracker
