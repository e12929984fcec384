"""One progress bar for a long command-line job (converting or examining a checkpoint): tqdm, the ecosystem's
default, on stderr, with the current step's words beside the bar instead of one printed line per step."""
import contextlib
import sys

from tqdm import tqdm


@contextlib.contextmanager
def progress_bar(description: str, file=None):
    """Yields a progress callback of megatron/checkpoint (one message per step): each message advances the bar
    and replaces the words beside it."""
    with tqdm(desc=description, unit=" step", file=file or sys.stderr, dynamic_ncols=True) as bar:
        def advance(message: str) -> None:
            bar.set_postfix_str(message, refresh=False)
            bar.update()
        yield advance
