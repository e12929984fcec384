"""--window-size (Mistral's sliding window, 7 keys inside the 32-token sequence) trains on TP 2 x PP 2 x DP 2
(sequence parallel, ZeRO 1, recomputation) exactly as on one process (real processes over gloo, fp32)."""
import pytest

from tests.helpers.distributed import run_on_ranks
from tests.helpers.training import COMMON, assert_same_training, train
from tests.model.test_llama import LLAMA_FLAGS, THREE_D


@pytest.mark.full
def test_a_sliding_window_trains_the_same_on_tp2_pp2_dp2_as_on_one_process(data_prefix):
    def run(ranks, *flags):
        return run_on_ranks(train, ranks, [*COMMON, *LLAMA_FLAGS, "--window-size", "7,0", "--data-path",
                                           data_prefix, *flags], timeout=600)[0]

    single = run(1)
    assert_same_training(run(8, *THREE_D), single)
