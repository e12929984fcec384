"""TensorBoard scalars under upstream's tag names (megatron/training/tensorboard_log.py's ScalarLog over its
TensorBoard writer): each training scalar
against the iteration with its " vs samples" / " vs tokens" twins, the optional ones only when asked for, read
back from the event files."""
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from megatron.training.tensorboard_log import ScalarLog, TensorBoardOptions, TensorBoardWriter


def written(directory, options: TensorBoardOptions) -> EventAccumulator:
    log = ScalarLog([TensorBoardWriter(str(directory), options.queue_size)], options)
    for iteration in (1, 2):
        log.training(iteration, samples=8 * iteration, tokens=128 * iteration, loss=3.0 / iteration,
                     learning_rate=0.1, batch_size=8, loss_scale=1024.0, grad_norm=0.5, num_zeros=None,
                     params_norm=None)
    log.validation(2, samples=16, tokens=256, loss=1.25, ppl=3.5)
    log.close()
    events = EventAccumulator(str(directory))
    events.Reload()
    return events


def points(events, tag) -> list:
    return [(event.step, event.value) for event in events.Scalars(tag)]


def test_the_default_scalars_and_their_twins(tmp_path):
    events = written(tmp_path, TensorBoardOptions())
    assert points(events, "lm-loss-training/lm loss") == [(1, 3.0), (2, 1.5)]
    assert points(events, "lm-loss-training/lm loss vs samples") == [(8, 3.0), (16, 1.5)]
    assert points(events, "lm-loss-training/lm loss vs tokens") == [(128, 3.0), (256, 1.5)]
    assert points(events, "steps-vs-samples/y=samples,x=steps") == [(1, 8.0), (2, 16.0)]
    assert points(events, "loss-scale/loss-scale vs tokens") == [(128, 1024.0), (256, 1024.0)]
    assert points(events, "grad-norm/grad-norm") == [(1, 0.5), (2, 0.5)]
    assert points(events, "lm-loss-validation/lm loss validation vs tokens") == [(256, 1.25)]
    tags = events.Tags()["scalars"]
    assert not [tag for tag in tags if tag.startswith(("batch-size", "num-zeros", "params-norm"))]
    assert "lm-loss-validation/lm loss validation ppl" not in tags


def test_optional_scalars_only_when_asked_for(tmp_path):
    options = TensorBoardOptions(learning_rate=False, loss_scale=False, batch_size=True, validation_ppl=True)
    events = written(tmp_path, options)
    tags = events.Tags()["scalars"]
    assert not [tag for tag in tags if tag.startswith(("learning-rate", "loss-scale"))]
    assert points(events, "batch-size/batch-size vs samples") == [(8, 8.0), (16, 8.0)]
    assert points(events, "lm-loss-validation/lm loss validation ppl") == [(2, 3.5)]


def test_due_every_log_interval(tmp_path):
    options = TensorBoardOptions(log_interval=3)
    log = ScalarLog([TensorBoardWriter(str(tmp_path), options.queue_size)], options)
    assert [iteration for iteration in range(1, 10) if log.due(iteration)] == [3, 6, 9]
    log.close()
