"""--add-qkv-bias (Qwen2's q/k/v biases under --disable-bias-linear) trains on TP 2 x PP 2 x DP 2 (sequence
parallel, ZeRO 1, recomputation) exactly as on one process: the column-parallel QKV bias is split with its
weight's rows (real processes over gloo, fp32)."""
import pytest

from tests.helpers.distributed import run_on_ranks
from tests.helpers.training import COMMON, assert_same_training, train
from tests.model.test_llama import LLAMA_FLAGS, THREE_D

QWEN2_FLAGS = [*LLAMA_FLAGS, "--add-qkv-bias", "--rotary-position-embeddings-theta", "1000000"]


@pytest.mark.full
def test_qkv_biases_train_the_same_on_tp2_pp2_dp2_as_on_one_process(data_prefix):
    def run(ranks, *flags):
        return run_on_ranks(train, ranks, [*COMMON, *QWEN2_FLAGS, "--data-path", data_prefix, *flags], timeout=600)[0]

    single = run(1)
    biases = [name for name in single[1] if name.endswith("bias")]
    assert biases and all("query_key_value" in name for name in biases)
    assert_same_training(run(8, *THREE_D), single)
