"""Parallel training through pretrain() on real gloo processes equals single-process training (fp32, dropout 0):
per-iteration losses within 1e-5 relative and the same weights afterwards, for TP (at the default stage, ZeRO 0 over
one data-parallel rank; with sequence parallelism on the pipeline engine with ZeRO 1 and on the plain one with
ZeRO 0), DP with every ZeRO stage, and TP x DP; a TP x DP checkpoint resumes exactly."""
import pytest
import torch

from tests.helpers.distributed import run_on_ranks
from tests.helpers.training import COMMON, assert_same_training, train

pytestmark = pytest.mark.full  # multi-process / whole-run tests: the full tier

@pytest.mark.parametrize("ranks, flags", [
    (2, ["--tensor-model-parallel-size", "2"]),
    (2, ["--tensor-model-parallel-size", "2", "--sequence-parallel", "--zero-stage", "1"]),
    (4, ["--tensor-model-parallel-size", "4"]),
    (4, ["--tensor-model-parallel-size", "4", "--sequence-parallel", "--zero-stage", "1"]),
    (2, ["--tensor-model-parallel-size", "2", "--sequence-parallel", "--no-pipeline-parallel", "--zero-stage", "0"]),
    (2, ["--zero-stage", "0"]),
    (2, ["--zero-stage", "1"]),
    (2, ["--zero-stage", "2", "--no-pipeline-parallel"]),
    (2, ["--zero-stage", "3", "--no-pipeline-parallel"]),
], ids=["tp2", "tp2-sp", "tp4", "tp4-sp", "tp2-sp-plain-engine-zero0", "dp2-zero0", "dp2-zero1", "dp2-zero2", "dp2-zero3"])
def test_parallel_layout_equals_single_process(ranks, flags, data_prefix, single_process):
    result = run_on_ranks(train, ranks, [*COMMON, "--data-path", data_prefix, *flags])[0]
    assert_same_training(result, single_process)


def test_tp2_dp2_trains_like_single_process_and_resumes_exactly(data_prefix, single_process, tmp_path):
    layout = ["--tensor-model-parallel-size", "2", "--sequence-parallel", "--data-path", data_prefix]
    save = ["--save", str(tmp_path), "--save-interval", "3"]
    straight = run_on_ranks(train, 4, [*COMMON, *layout, *save])[0]
    assert_same_training(straight, single_process)

    # Resume from the iteration-3 checkpoint: iterations 4 and 5 must repeat exactly.
    (tmp_path / "latest").write_text("global_step3")
    resumed = run_on_ranks(train, 4, [*COMMON, *layout, "--load", str(tmp_path)])[0]
    assert resumed[0] == straight[0][3:]
    for name, tensor in resumed[1].items():
        torch.testing.assert_close(tensor, straight[1][name], rtol=0, atol=0, msg=name)
