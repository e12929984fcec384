"""What the terminal shows of a failing multi-process job: its output up to the first failure, then the first
failing rank's message once."""
from megatron.reports.job_output import FirstFailure

FAILING_JOB = """\
 iteration        1/      12 | lm loss: 5.5E+00 |
error: --load /ckk holds no checkpoint (it does not exist; it is not --save /ck)
error: --load /ckk holds no checkpoint (it does not exist; it is not --save /ck)
[rank1]: Traceback (most recent call last):
[rank1]:   File "pretrain_gpt.py", line 21, in <module>
[rank1]: RuntimeError: Connection closed by peer
E1123 torch/distributed/elastic/multiprocessing/api.py:874] failed (exitcode: 2) local_rank: 0
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
"""


def shown(text):
    failure = FirstFailure()
    return [line for line in text.splitlines(keepends=True) if failure.show(line)], failure


def test_the_first_error_line_is_kept_and_what_follows_it_is_not_shown():
    lines, failure = shown(FAILING_JOB)
    assert lines == [" iteration        1/      12 | lm loss: 5.5E+00 |\n"]
    assert failure.failed and failure.message == "--load /ckk holds no checkpoint (it does not exist; it is not " \
                                                 "--save /ck)"


def test_a_crash_without_an_error_line_is_reported_by_its_exception_line():
    lines, failure = shown("step 1\n[rank3]: Traceback (most recent call last):\n"
                           "[rank3]:   File \"x.py\", line 1\n[rank3]: ZeroDivisionError: division by zero\n"
                           "[rank0]: Traceback (most recent call last):\n")
    assert lines == ["step 1\n"] and failure.message == "ZeroDivisionError: division by zero"


def test_a_clean_job_shows_everything():
    lines, failure = shown("a\nb\n")
    assert lines == ["a\n", "b\n"] and not failure.failed and failure.message is None
