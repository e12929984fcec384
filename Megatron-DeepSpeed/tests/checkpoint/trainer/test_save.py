"""`latest` only ever names a checkpoint whose files are all written; each rank writes its files as upstream's."""
import os

import pytest
import torch
from tests.helpers.distributed import run_on_ranks
from tests.helpers.training import COMMON, ITERATIONS, train

pytestmark = pytest.mark.full  # multi-process / whole-run tests: the full tier


class EngineThatDiesMidSave:
    """Writes part of a checkpoint, then fails, as a crash or a full disk would."""
    module = torch.nn.Linear(2, 2)

    def save_checkpoint(self, save_dir, tag, client_state, save_latest):
        assert save_latest is False  # DeepSpeed's own `latest` is written before other ranks finish
        os.makedirs(os.path.join(save_dir, tag), exist_ok=True)
        with open(os.path.join(save_dir, tag, "mp_rank_00_model_states.pt"), "wb") as handle:
            handle.write(b"half")
        raise OSError("disk full")


class EngineThatSaves:
    module = torch.nn.Linear(2, 2)

    def save_checkpoint(self, save_dir, tag, client_state, save_latest):
        os.makedirs(os.path.join(save_dir, tag), exist_ok=True)


def save_then_fail(save_dir):
    from megatron.checkpoint.trainer.save import save_checkpoint
    from megatron.errors import RunError
    from megatron.tensor_parallel import tensor_parallel_rng_tracker

    flags = {"save": save_dir, "seed": 1, "num_layers": 2, "hidden_size": 8, "num_attention_heads": 2,
             "max_position_embeddings": 16, "seq_length": 16, "zero_stage": 1,
             "tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1, "no_pipeline_parallel": False}
    tracker = tensor_parallel_rng_tracker(1, 0)
    save_checkpoint(EngineThatSaves(), save_dir, flags, 10, 80, tracker, padded_vocab_size=128)
    try:
        save_checkpoint(EngineThatDiesMidSave(), save_dir, flags, 20, 160, tracker, padded_vocab_size=128)
    except RunError as err:
        message = str(err)
    return (open(os.path.join(save_dir, "latest")).read(),
            open(os.path.join(save_dir, "latest_checkpointed_iteration.txt")).read(),
            sorted(name for name in os.listdir(save_dir) if ".tmp" in name or name.startswith("global_step")),
            message)


def test_interrupted_save_leaves_latest_on_the_previous_checkpoint(tmp_path):
    (latest, iteration, left, message), = run_on_ranks(save_then_fail, 1, str(tmp_path))
    assert (latest, iteration, left) == ("global_step10", "10", ["global_step10"])  # partial global_step20 removed
    assert message.startswith(f"saving checkpoint global_step20 to {tmp_path} failed: OSError: disk full; ")


def test_plain_engine_ranks_write_their_module_nested_as_upstreams(data_prefix, tmp_path):
    """TP2 on the plain engine: each rank's model-states file holds upstream's nesting as DeepSpeed wrote it
    (nothing rewrites it), with the weights the run ended with."""
    from megatron.checkpoint.parameter_names import flatten
    from megatron.checkpoint.torch_files import load_file
    from megatron.checkpoint.shards import shard_of

    flags = [*COMMON, "--data-path", data_prefix, "--tensor-model-parallel-size", "2", "--no-pipeline-parallel",
             "--save", str(tmp_path), "--save-interval", str(ITERATIONS)]
    _, weights = run_on_ranks(train, 2, flags, timeout=300)[0]
    for tp in range(2):
        path = os.path.join(tmp_path, f"global_step{ITERATIONS}", f"mp_rank_0{tp}_model_states.pt")
        module = load_file(path)["module"]
        assert list(module) == ["language_model"]
        saved = flatten(module)
        assert saved.keys() == weights.keys()
        for name, tensor in saved.items():
            assert torch.equal(tensor, shard_of(name, weights[name], tp, 2)), name
