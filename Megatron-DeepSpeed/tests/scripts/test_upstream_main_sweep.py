"""The 48 `examples_deepspeed/**/*.sh` scripts of upstream Megatron-DeepSpeed main (deepspeedai, 4efb479) that
launch pretrain_gpt.py: each flag set either trains here or stops with one line naming the feature it needs.

tests/fixtures/upstream_main_scripts.json holds, per script, the command line the script hands pretrain_gpt.py
(obtained by running the script with the launcher replaced by a recorder, its default settings, and for the two
scripts driven by another script that one's first configuration), the DeepSpeed JSON it writes, and the world size
its layout needs. Shrinking: model sizes to a few heads of 8 values (heads a multiple of TP and the Ulysses size),
sequence 32, micro-batch 1-2, global batch micro x DP x 2, iteration/sample/token counts and intervals small,
expert counts 2-4 with expert parallelism 2 over 2 data-parallel ranks, --fp16 dropped (no fp16 training on a CPU)
with the JSON's fp16 section off to match, nccl replaced by gloo, paths replaced by {data}, {vocab}, {merges},
{tokenizer_model}, {out} and {ds_config}. Flags and their values are otherwise upstream's.

`python -m tests.scripts.test_upstream_main_sweep` prints the outcome table docs/upstream-main.md carries.
"""
import json
import os

import pytest
from tests.helpers.distributed import run_on_ranks
from tests.tokenizer.test_sentencepiece_tokenizer import train_sentencepiece
from tests.scripts.test_upstream_scripts import train_each, write_byte_level_vocab

from megatron.config.arguments import job_config, parse_args, validate_args
from megatron.config.ds_config import resolve_deepspeed_config
from megatron.errors import InputError
from megatron.training.log_lines import parse_log
from tests.helpers.paths import DOCS, FIXTURES

SCRIPTS = json.load(open(os.path.join(FIXTURES, "upstream_main_scripts.json"), encoding="utf-8"))
DOCS_PAGE = os.path.join(DOCS, "upstream-main.md")

RUNS = "runs"
KD = "--kd: Megatron-DeepSpeed's knowledge distillation"
MOS = "--mos: Megatron-DeepSpeed's mixture-of-students distillation"
FPDT = "--ds-sequence-parallel-fpdt: Megatron-DeepSpeed's FPDT"
# Each script's outcome: RUNS, or the start of the one line that refuses it.
EXPECTED = {
    "MoE/ds_pretrain_gpt_1.3B_MoE128.sh": RUNS,
    "MoE/ds_pretrain_gpt_1.3B_PR-MoE64or128.sh": RUNS,
    "MoE/ds_pretrain_gpt_1.3B_PR-MoE64or128_MoS.sh": MOS,
    "MoE/ds_pretrain_gpt_1.3B_dense.sh": RUNS,
    "MoE/ds_pretrain_gpt_1.3B_dense_cl.sh": RUNS,
    "MoE/ds_pretrain_gpt_125M_MoE64.sh": RUNS,
    "MoE/ds_pretrain_gpt_125M_dense_cl.sh": RUNS,
    "MoE/ds_pretrain_gpt_350M_MoE128.sh": RUNS,
    "MoE/ds_pretrain_gpt_350M_PR-MoE32or64.sh": RUNS,
    "MoE/ds_pretrain_gpt_350M_PR-MoE32or64_MoS.sh": MOS,
    "MoE/ds_pretrain_gpt_350M_dense.sh": RUNS,
    "MoE/ds_pretrain_gpt_6.7B_dense.sh": RUNS,
    "azure/run-175b.sh": RUNS,
    "azure/run-1t.sh": RUNS,
    "azure/run-benchmark-model.sh": RUNS,
    "compression/125M-Int8-test-64gpu-distilled-group48.sh": RUNS,
    "compression/125M-L10-Int8-test-64gpu-distilled-group48.sh": RUNS,
    "compression/125M-L12-Int8-test-64gpu-distilled-group48.sh": RUNS,
    "compression/ds_pretrain_gpt_1.3B_dense_cl_kd.sh": KD,
    "compression/ds_pretrain_gpt_125M_dense_cl_kd.sh": KD,
    "compression/ds_pretrain_gpt_125M_dense_kd.sh": KD,
    "compression/ds_pretrain_gpt_350M_dense_kd.sh": RUNS,
    # Its JSON also configures an optimizer, which DeepSpeed would ignore beside the trainer's (upstream's too).
    "curriculum_learning/ds_pretrain_gpt2.sh": "has an 'optimizer' section, which would be ignored",
    "curriculum_learning/ds_pretrain_gpt_1.3B_rope_slw.sh": RUNS,
    # The data-efficiency library enabled with every part off: the baseline, which trains as without it.
    "data_efficiency/gpt/pretrain/ds_pretrain_gpt_1.3B_dense_base_script.sh": RUNS,
    "deepspeed4science/megatron_long_seq_support/pretrain_gpt_1.3B_seq_parallel.sh": RUNS,
    "deepspeed4science/megatron_long_seq_support/pretrain_gpt_30B_seq_parallel.sh": RUNS,
    # Upstream's own script contradicts itself: --fp16 on the command line, bf16 in the JSON it writes.
    "offload_pp/ds_pretrain_gpt_350M.sh": "sets bf16.enabled=true but --bf16 is off",
    "pretrain_llama2_distributed.sh": RUNS,
    "pretrain_llama_distributed.sh": RUNS,
    "rebase/ds_pretrain_gpt_1.3B.sh": RUNS,
    "rebase/ds_pretrain_gpt_1.3B_megatron_checkpointing.sh": RUNS,
    "rebase/ds_pretrain_gpt_1.3B_rope.sh": RUNS,
    "rebase/ds_pretrain_gpt_1.3B_rope_slw.sh": RUNS,
    "rebase/ds_pretrain_gpt_125M.sh": RUNS,
    "rebase/ds_pretrain_gpt_125M_flashattn.sh": RUNS,
    "rebase/ds_pretrain_gpt_13B.sh": RUNS,
    "run_deepspeed_example.sh": RUNS,
    "sequence_parallel/ds_pretrain_gpt_1.3B_seq_parallel_32k.sh": RUNS,
    "sequence_parallel/ds_pretrain_gpt_30B_seq_parallel_32k.sh": RUNS,
    "sequence_parallel/ds_pretrain_gpt_6.7B_fpdt_32k.sh": FPDT,  # DeepSpeed-Ulysses itself runs
    "universal_checkpointing/llama/run_llama_bf16.sh": RUNS,
    "universal_checkpointing/llama/run_universal_llama_bf16.sh": RUNS,
    "universal_checkpointing/megatron_gpt/run_bf16.sh": RUNS,
    "universal_checkpointing/megatron_gpt/run_fp16.sh": RUNS,
    "universal_checkpointing/megatron_gpt/run_universal_bf16.sh": RUNS,
    "universal_checkpointing/megatron_gpt/run_universal_fp16.sh": RUNS,
    "zero_bubble_pp/zbh1_pretrain_gpt_1.3b.sh": "--enable-zbh1-pipeline: Megatron-DeepSpeed's zero-bubble",
}
# A few representative flag sets trained for real (the full tier): main's recompute flags and renamed flags at TP2,
# ZeRO-2 / ZeRO-3 runs of the plain engine on one process, and a sequence-length curriculum (8 to 32 tokens, with
# DeepSpeed's activation checkpointing) whose --train-tokens budget counts the shorter sequences.
TRAINED = {2: ["rebase/ds_pretrain_gpt_1.3B_megatron_checkpointing.sh"],
           1: ["run_deepspeed_example.sh", "azure/run-benchmark-model.sh", "MoE/ds_pretrain_gpt_125M_dense_cl.sh"]}


def command_line(script: str, files: dict, out: str) -> list:
    """The script's flags with the placeholders filled; its DeepSpeed JSON written to {out}/ds_config.json."""
    os.makedirs(out, exist_ok=True)
    ds_config = os.path.join(out, "ds_config.json")
    if SCRIPTS[script]["deepspeed_json"] is not None:
        with open(ds_config, "w", encoding="utf-8") as handle:
            json.dump(SCRIPTS[script]["deepspeed_json"], handle)
    return [part.format(out=out, ds_config=ds_config, **files) for part in SCRIPTS[script]["flags"].split()]


def outcome(script: str, files: dict, out: str) -> str:
    """RUNS if the flags parse, validate and give a DeepSpeed config at the script's world size, else the one line
    that refuses them."""
    try:
        job = job_config(validate_args(parse_args(command_line(script, files, out)),
                                       SCRIPTS[script]["world_size"], "cpu"))
        resolve_deepspeed_config(job)
    except InputError as error:
        return str(error)
    return RUNS


@pytest.fixture(scope="module")
def files(data_prefix, tmp_path_factory):
    vocab, merges = write_byte_level_vocab(tmp_path_factory.mktemp("vocab"))
    model = train_sentencepiece(tmp_path_factory.mktemp("sentencepiece") / "tokenizer.model")
    return {"data": data_prefix, "vocab": vocab, "merges": merges, "tokenizer_model": model}


def test_the_sweep_holds_every_script_once():
    assert len(SCRIPTS) == 48 and set(EXPECTED) == set(SCRIPTS)


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_the_flag_set_parses_or_is_refused_in_one_line(script, files, tmp_path):
    result = outcome(script, files, str(tmp_path))
    assert "\n" not in result
    if EXPECTED[script] == RUNS:
        assert result == RUNS
    else:
        assert result.startswith(EXPECTED[script]) or EXPECTED[script] in result
        assert "unrecognized arguments" not in result


def test_the_documentation_table_is_the_sweeps():
    with open(DOCS_PAGE, encoding="utf-8") as handle:
        assert outcome_table() in handle.read()


@pytest.mark.full
def test_representative_flag_sets_train(files, tmp_path):
    for world_size, scripts in TRAINED.items():
        argvs = [command_line(script, files, str(tmp_path / script.replace("/", "_"))) for script in scripts]
        outcomes = run_on_ranks(train_each, world_size, argvs, timeout=600)[-1]
        for script, (stdout, losses) in zip(scripts, outcomes):
            records = parse_log(stdout).iterations
            assert records and len(losses) == records[-1].iteration, (script, stdout)
            assert all(0 < loss < 10 for loss in losses), (script, losses)
            if script.endswith("_cl.sh"):  # 3 iterations of 4 samples (--train-samples 12): 192 of 256 tokens
                assert [record.curriculum_seqlen for record in records] == [8, 16, 24], stdout


def outcome_table() -> str:
    """The markdown table of every script and its expected outcome."""
    rows = ["| upstream script (examples_deepspeed/) | outcome here |", "|---|---|"]
    for script in sorted(SCRIPTS):
        cell = "runs" if EXPECTED[script] == RUNS else f"refused: {EXPECTED[script]} ..."
        rows.append(f"| `{script}` | {cell} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(outcome_table())
