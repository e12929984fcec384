"""The training loop (loop.py) and what serves it: optimizer and learning rate, step guards, log lines and
metrics, runs that end early (divergence, exit requests, watchdog), FLOPs and profiling.

`from megatron.training import pretrain` works as in upstream Megatron; it is resolved on first use, so importing
a light module of this package (e.g. log_lines) does not import DeepSpeed."""


def __getattr__(name):
    if name == "pretrain":
        from megatron.training.loop import pretrain
        return pretrain
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
