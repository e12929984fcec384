"""docs/ARCHITECTURE.md, Log lines log formats, byte for byte, and the parser that reads them back from noisy logs."""
import dataclasses

import pytest

from megatron.training.log_lines import (IterationRecord, ValidationRecord, final_evaluation_lines, iteration_line,
                                         memory_line, parse_log, perplexity, validation_lines)

RECORD = IterationRecord(iteration=3, train_iters=100, consumed_samples=48, elapsed_ms=1234.56,
                         learning_rate=1.5e-4, global_batch_size=16, lm_loss=7.123456789,
                         loss_scale=4096.0, grad_norm=1.23456, skipped_iterations=0,
                         nan_iterations=1, samples_per_second=12.9654, tflops=3.14159, mfu=0.4567)


def test_iteration_line_matches_the_literal_format():
    assert iteration_line(**dataclasses.asdict(RECORD)) == (
        " iteration        3/     100 | consumed samples:           48 |"
        " elapsed time per iteration (ms): 1234.6 | learning rate: 1.500E-04 |"
        " global batch size:    16 | lm loss: 7.123457E+00 | loss scale: 4096.0 |"
        " grad norm: 1.235 | number of skipped iterations:   0 |"
        " number of nan iterations:   1 | samples per second: 12.965 | TFLOPs: 3.14 | MFU: 45.7% |")


def test_unknown_peak_prints_na_and_tiny_tflops_keep_their_digits():
    line = iteration_line(**{**dataclasses.asdict(RECORD), "tflops": 0.000123, "mfu": None})
    assert line.endswith(" TFLOPs: 1.2e-04 | MFU: n/a |")
    record = parse_log(line).iterations[0]
    assert record.tflops == pytest.approx(1.2e-4) and record.mfu is None


def test_wide_numbers_overflow_their_fields_without_truncation():
    line = iteration_line(123456789, 500000000, 10 ** 13, 1.0, 1.0, 123456, 1.0, 1.0, 1.0,
                          1000, 0, 1.0, 1.0)
    assert line.startswith(" iteration 123456789/500000000 | consumed samples: 10000000000000 |")
    assert " global batch size: 123456 |" in line
    assert " number of skipped iterations: 1000 |" in line


def test_validation_lines_are_framed_by_dashes_one_longer_than_the_result():
    dashes = "-" * 95
    assert validation_lines(100, 2.0) == "\n".join((
        dashes,
        " validation loss at iteration 100 | lm loss value: 2.000000E+00 |"
        " lm loss PPL: 7.389056E+00 | ",
        dashes))


def test_validation_prefix_and_capped_perplexity():
    first, middle, last = validation_lines(7, 25.0, prefix="test").split("\n")
    assert middle == (" test loss at iteration 7 | lm loss value: 2.500000E+01 |"
                      " lm loss PPL: 4.851652E+08 | ")
    assert first == last == "-" * (len(middle) + 1)


def test_end_of_run_blocks_in_upstream_wording_and_their_split():
    block = final_evaluation_lines(300, 320, "test", 2.0)
    first, middle, last = block.split("\n")
    assert middle == (" validation loss at iteration 300 on 320-sample draw from test set | lm loss value: "
                      "2.000000E+00 | lm loss PPL: 7.389056E+00 | ")
    assert first == last == "-" * (len(middle) + 1)
    parsed = parse_log([block, final_evaluation_lines(300, 320, "validation", 1.5), validation_lines(300, 1.0)])
    assert [(record.prefix, record.iteration, record.loss) for record in parsed.validations] == \
           [("test", 300, 2.0), ("validation", 300, 1.5), ("validation", 300, 1.0)]


def test_perplexity_is_exp_of_the_loss_capped_at_20():
    assert perplexity(0.0) == 1.0
    assert perplexity(2.0) == pytest.approx(7.38905609893065)
    assert perplexity(20.0) == perplexity(1000.0) == pytest.approx(485165195.4097903)


REAL_LOG = """\
[2024-05-01 10:00:00,123] [INFO] [real_accelerator.py:203:get_accelerator] Setting ds_accelerator to cuda (auto detect)
using world size: 8, data-parallel-size: 4, tensor-model-parallel size: 1, pipeline-model-parallel size: 2
> building train, validation, and test datasets ...
[default7]: iteration       10/     300 | consumed samples:          160 | elapsed time per iteration (ms): 512.3 | learning rate: 1.500E-04 | global batch size:    16 | lm loss: 9.876543E+00 | loss scale: 65536.0 | grad norm: 12.345 | number of skipped iterations:   0 | number of nan iterations:   0 | samples per second: 31.231 | TFLOPs: 12.34 |
[2024-05-01 10:00:05,456] [INFO] [logging.py:96:log_dist] [Rank 0] step=10, skipped=0, lr=[0.00015], mom=[(0.9, 0.999)]
/usr/lib/python3/site-packages/torch/utils/checkpoint.py:61: UserWarning: None of the inputs have requires_grad=True. Gradients will be None
 iteration       20/     300 | consumed samples:          320 | consumed tokens:       327680 | elapsed time per iteration (ms): 421.3 | learning rate: 9.375E-05 | global batch size:    16 | lm loss: 7.654321E+00 | loss scale: 65536.0 | grad norm: 2.345 | actual seqlen:  1024 | number of skipped iterations:   1 | number of nan iterations:   0 | samples per second: 37.977 | tokens per gpu per second (tgs): 4861.056 | TFLOPs: 15.11 |
 iteration       30/     300 | consumed samples:          480 | elapsed time per iteration (ms): 400.0 | learning rate: 9.000E-05 | global batch size:    16 | lm loss: 7.100000E+00 | loss scale: 1.0 | number of skipped iterations:   0 | number of nan iterations:   0 |
time (ms) | forward-compute: 101.23 | backward-compute: 202.46 | optimizer: 10.00
-----------------------------------------------------------------------------------------------
 validation loss at iteration 30 | lm loss value: 7.012345E+00 | lm loss PPL: 1.110624E+03 | 
-----------------------------------------------------------------------------------------------
 iteration       40/     300 | consumed samples:          640 | elapsed time per iteration (ms): 39
[after training is done] datetime: 2024-05-01 10:05:00
--------------------------------------------------------------------------------------------------------------------
 validation loss at the end of training for val data | lm loss value: 6.900000E+00 | lm loss PPL: 9.921282E+02 | 
 test loss at iteration 300 | lm loss value: 6.950000E+00 | lm loss PPL: 1.043 |
"""


def test_parser_reads_real_logs_among_noise():
    parsed = parse_log(REAL_LOG.splitlines(keepends=True))
    assert [record.iteration for record in parsed.iterations] == [10, 20, 30, 40]
    assert parsed.iterations[0] == IterationRecord(
        iteration=10, train_iters=300, consumed_samples=160, elapsed_ms=512.3,
        learning_rate=1.5e-4, global_batch_size=16, lm_loss=9.876543, loss_scale=65536.0,
        grad_norm=12.345, skipped_iterations=0, nan_iterations=0, samples_per_second=31.231,
        tflops=12.34)
    # Megatron-DeepSpeed's extra fields are ignored, the known ones still read.
    second = parsed.iterations[1]
    assert (second.lm_loss, second.skipped_iterations, second.samples_per_second,
            second.tflops) == (7.654321, 1, 37.977, 15.11)
    # Fields a line does not carry are None.
    third = parsed.iterations[2]
    assert (third.lm_loss, third.grad_norm, third.samples_per_second, third.tflops) == (
        7.1, None, None, None)
    # A line cut off mid-number keeps only its complete fields.
    assert parsed.iterations[3] == IterationRecord(iteration=40, train_iters=300,
                                                   consumed_samples=640)
    # The end-of-training summary has no iteration number and is not a validation record.
    assert parsed.validations == [
        ValidationRecord(iteration=30, loss=7.012345, ppl=1110.624),
        ValidationRecord(iteration=300, loss=6.95, ppl=1.043, prefix="test")]


def test_parser_takes_one_string_too():
    assert parse_log(REAL_LOG) == parse_log(REAL_LOG.splitlines())


def test_parser_ignores_lines_that_only_mention_iterations():
    noise = ["iteration 5 done", "loss at iteration 5 | nothing: here |",
             " validation loss at iteration 5 | lm loss value: broken | lm loss PPL: 1.0 | ",
             "resuming from iteration 5/10"]
    parsed = parse_log(noise)
    assert parsed.iterations == [] and parsed.validations == []


def test_round_trip_of_our_own_lines():
    records = [RECORD,
               dataclasses.replace(RECORD, iteration=4, consumed_samples=64, elapsed_ms=98.7,
                                   learning_rate=2.25e-4, lm_loss=6.5, loss_scale=1.0,
                                   grad_norm=0.5, nan_iterations=0, samples_per_second=162.5,
                                   tflops=0.25)]
    # Values at the printed precision survive formatting and parsing exactly.
    exact = [dataclasses.replace(record, elapsed_ms=round(record.elapsed_ms, 1),
                                 lm_loss=float(f"{record.lm_loss:.6E}"),
                                 grad_norm=round(record.grad_norm, 3),
                                 samples_per_second=round(record.samples_per_second, 3),
                                 tflops=round(record.tflops, 2),
                                 mfu=float(f"{100 * record.mfu:.1f}") / 100)
             for record in records]
    validations = [ValidationRecord(iteration=4, loss=6.25, ppl=float(f"{perplexity(6.25):.6E}")),
                   ValidationRecord(iteration=4, loss=6.5,
                                    ppl=float(f"{perplexity(6.5):.6E}"), prefix="test")]
    text = [iteration_line(**dataclasses.asdict(record)) for record in exact]
    text += [validation_lines(v.iteration, v.loss, prefix=v.prefix) for v in validations]
    parsed = parse_log("\n".join(text))
    assert parsed.iterations == exact
    assert parsed.validations == validations


def test_memory_line_in_megatron_layout_and_the_parser_keeps_the_last_peak():
    mib = 2 ** 20
    first = memory_line(3, 1, {"allocated_bytes": 10 * mib, "peak_allocated_bytes": 12.5 * mib,
                                "reserved_bytes": 16 * mib, "peak_reserved_bytes": 16 * mib})
    assert first == ("[Rank 3] (after 1 iterations) memory (MB) | allocated: 10.0 | max allocated: 12.5 | "
                     "reserved: 16.0 | max reserved: 16.0")
    last = first.replace("after 1 iterations", "after 9 iterations").replace("max allocated: 12.5", "max allocated: 20.0")
    assert parse_log(["noise", first, last]).peak_allocated_mb == 20.0
    assert parse_log(["noise"]).peak_allocated_mb is None
