"""Reshaped checkpoints resume training exactly (fp32, dropout 0, real gloo processes): a TP2 x PP2 x DP2 ZeRO-1
checkpoint continues on one process, and its TP1 copy continues again at TP2 x PP2; ZeRO-2 and ZeRO-3 checkpoints
written at DP2 continue at DP1 (each on the other stage); DeepSpeed's own ds_to_universal output of a TP2 x DP2
checkpoint continues at TP1 x PP2. The resumed losses are the uninterrupted run's, within the parity tests'
tolerance; reshaping itself changes no weight (the examiner)."""
import os
import subprocess
import sys

import pytest

from megatron.checkpoint.reshape.conversions import reshape
from megatron.hf.examine import differences, examine
from megatron.checkpoint.formats.reader import read_checkpoint
from megatron.checkpoint.reshape.target_writer import TargetLayout
from tests.helpers.distributed import run_on_ranks
from tests.helpers.training import COMMON, ITERATIONS, train
from tests.helpers.paths import FIXTURES

pytestmark = pytest.mark.full  # multi-process / whole-run tests: the full tier
SAVED_AT = 3
TP2_PP2 = ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"]
PLAIN = ["--no-pipeline-parallel"]


def run(ranks, data_prefix, *flags):
    return run_on_ranks(train, ranks, [*COMMON, "--data-path", data_prefix, *flags], timeout=600)[0]


def saved(directory):
    return ["--save", str(directory), "--save-interval", str(SAVED_AT)]


def assert_continues(resumed_losses, straight_losses):
    assert len(straight_losses) == ITERATIONS
    assert resumed_losses == pytest.approx(straight_losses[SAVED_AT:], rel=1e-5)


@pytest.fixture(scope="module")
def eight_ranks(data_prefix, tmp_path_factory):
    """An uninterrupted TP2 x PP2 x DP2 ZeRO-1 run (8 processes), with the checkpoint it wrote at iteration 3."""
    save = tmp_path_factory.mktemp("tp2pp2dp2")
    losses, _ = run(8, data_prefix, *TP2_PP2, *saved(save))
    return losses, str(save)


@pytest.fixture(scope="module")
def single_process_copy(eight_ranks, tmp_path_factory):
    _, save = eight_ranks
    copy = str(tmp_path_factory.mktemp("reshaped") / "tp1pp1")
    reshape(save, copy, TargetLayout(1, 1), iteration=SAVED_AT)
    return copy


def test_tp2_pp2_dp2_checkpoint_continues_on_one_process(eight_ranks, single_process_copy, data_prefix):
    straight, save = eight_ranks
    assert max(differences(examine(os.path.join(save, f"global_step{SAVED_AT}")),
                           examine(single_process_copy)).values()) == 0.0
    assert max(differences(examine(save), examine(single_process_copy)).values()) > 0  # iteration 5 moved on
    # ZeRO 0 reads the copy's torch optimizer state; any ZeRO stage would do (see the DP tests below).
    resumed, _ = run(1, data_prefix, "--load", single_process_copy, "--zero-stage", "0")
    assert_continues(resumed, straight)


def test_tp1_copy_continues_at_tp2_pp2(eight_ranks, single_process_copy, data_prefix, tmp_path):
    straight, _ = eight_ranks
    reshape(single_process_copy, str(tmp_path / "tp2pp2"), TargetLayout(2, 2))
    assert read_checkpoint(str(tmp_path / "tp2pp2")).iteration == SAVED_AT
    resumed, _ = run(4, data_prefix, *TP2_PP2, "--load", str(tmp_path / "tp2pp2"))
    assert_continues(resumed, straight)


@pytest.mark.parametrize("stage, resumed_stage", [(2, 3), (3, 2)])
def test_zero_checkpoint_at_dp2_continues_at_dp1(stage, resumed_stage, data_prefix, tmp_path):
    straight, _ = run(2, data_prefix, *PLAIN, "--zero-stage", str(stage), *saved(tmp_path / "dp2"))
    reshape(str(tmp_path / "dp2"), str(tmp_path / "dp1"), TargetLayout(1, 1, pipeline_engine=False),
            iteration=SAVED_AT)
    resumed, _ = run(1, data_prefix, *PLAIN, "--zero-stage", str(resumed_stage), "--load", str(tmp_path / "dp1"))
    assert_continues(resumed, straight)


@pytest.mark.parametrize("model", [[], ["--swiglu", "--ffn-hidden-size", "48"]], ids=["gelu", "swiglu"])
def test_deepspeeds_universal_conversion_continues_at_another_layout(data_prefix, tmp_path, model):
    """ds_to_universal joins each parameter's tensor-parallel slices as the checkpoint's universal_checkpoint_info
    says (a SwiGLU MLP's [gate_r; up_r] rows as two sub-parameters, as upstream main declares them: joined
    otherwise, TP 1 would read [gate_0; up_0; gate_1; up_1]); resumed with --universal-checkpoint
    (latest_universal) at another TP, PP and DP."""
    vocab = ["--vocab-size", "255", *model]  # 256 tokens, no padding rows: ds_to_universal strips those (upstream's)
    straight, _ = run(4, data_prefix, *vocab, "--tensor-model-parallel-size", "2", *saved(tmp_path))
    step = tmp_path / f"global_step{SAVED_AT}"
    subprocess.run([sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder", str(step),
                    "--output_folder", f"{step}_universal", "--num_extract_workers", "1", "--num_merge_workers", "1"],
                   check=True, capture_output=True)
    assert read_checkpoint(str(tmp_path), universal=True).directory == f"{step}_universal"
    resumed, _ = run(2, data_prefix, *vocab, "--pipeline-model-parallel-size", "2", "--load", str(tmp_path),
                     "--universal-checkpoint")
    assert_continues(resumed, straight)


DATA = os.path.join(FIXTURES, "checkpoints")
# The model of tests/fixtures/checkpoints (its README), on synthetic tokens.
DATA_MODEL = ["--num-layers", "2", "--hidden-size", "16", "--num-attention-heads", "2", "--seq-length", "16",
              "--max-position-embeddings", "16", "--tokenizer-type", "NullTokenizer", "--vocab-size", "40",
              "--make-vocab-size-divisible-by", "32", "--mock-data", "--micro-batch-size", "2", "--global-batch-size",
              "4", "--lr", "1e-2", "--hidden-dropout", "0", "--attention-dropout", "0", "--num-workers", "0",
              "--seed", "7", "--log-interval", "1", "--eval-iters", "0", "--train-iters", "4"]


@pytest.mark.parametrize("source, flags, target", [("megatron_tp1pp1", ["--finetune"], TargetLayout(2, 1)),
                                                   ("old_tp2pp2", ["--no-load-optim", "--override-lr-scheduler"],
                                                    TargetLayout(1, 2))])
def test_layouts_the_engine_cannot_load_train_as_their_conversion(source, flags, target, tmp_path):
    """Upstream's Megatron layout and this project's earlier one load their weights into another layout directly;
    training then goes as from the checkpoint convert_checkpoint.py makes of them (--finetune from iteration 0,
    --no-load-optim from the checkpoint's iteration 2)."""
    converted = str(tmp_path / "converted")
    reshape(os.path.join(DATA, source), converted, target)
    layout = ["--tensor-model-parallel-size", str(target.tensor), "--pipeline-model-parallel-size",
              str(target.pipeline)]
    direct, _ = run_on_ranks(train, 2, [*DATA_MODEL, *layout, *flags, "--load", os.path.join(DATA, source)])[0]
    through_conversion, _ = run_on_ranks(train, 2, [*DATA_MODEL, *layout, *flags, "--load", converted])[0]
    assert direct == through_conversion and len(direct) == (4 if "--finetune" in flags else 2)
