"""--qk-layernorm with --kv-channels (Qwen3's per-head q/k norms, heads of 16 channels at hidden 32) trains on
TP 2 x PP 2 x DP 2 (sequence parallel, ZeRO 1, recomputation) exactly as on one process: each tensor-parallel
rank's q/k norm gradient covers its own heads only and is summed over the ranks (real processes over gloo,
fp32); its checkpoint, reshaped with its Adam state to one process, continues as the 3D run did."""
import os

import pytest

from megatron.checkpoint.reshape.conversions import reshape
from megatron.checkpoint.reshape.target_writer import TargetLayout
from tests.helpers.distributed import run_on_ranks
from tests.helpers.training import COMMON, assert_same_training, train
from tests.model.test_llama import LLAMA_FLAGS, SAVED_AT, THREE_D

QWEN3_FLAGS = [*LLAMA_FLAGS, "--qk-layernorm", "--kv-channels", "16"]


@pytest.mark.full
def test_qk_norms_train_the_same_on_tp2_pp2_dp2_as_on_one_process_and_reshape_with_adam(data_prefix, tmp_path):
    def run(ranks, *flags):
        return run_on_ranks(train, ranks, [*COMMON, *QWEN3_FLAGS, "--data-path", data_prefix, *flags], timeout=600)[0]

    single = run(1)
    norms = [name for name in single[1] if name.endswith(("q_norm.weight", "k_norm.weight"))]
    assert len(norms) == 4 and all(tuple(single[1][name].shape) == (16,) for name in norms)
    save = str(tmp_path / "3d")
    three_d = run(8, *THREE_D, "--save", save, "--save-interval", str(SAVED_AT))
    assert_same_training(three_d, single)

    with open(os.path.join(save, "latest"), "w") as latest:
        latest.write(f"global_step{SAVED_AT}")
    copy = str(tmp_path / "tp1pp1")
    reshape(save, copy, TargetLayout(1, 1), iteration=SAVED_AT)
    continued, _ = run(1, "--load", copy, "--zero-stage", "0")
    assert continued == pytest.approx(three_d[0][SAVED_AT:], rel=1e-5)
