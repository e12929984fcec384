"""Weights & Biases as a second writer of the training scalars (tensorboard_log.ScalarLog): upstream main's
--wandb-project / --wandb-exp-name / --wandb-save-dir (default <save>/wandb) and Megatron-LM's --wandb-entity.

Each tag keeps its TensorBoard name and x-axis: W&B's step_metric of a tag is "iteration", "samples" or "tokens",
each logged as a value of its own, so the W&B run's own step counter is never set and a run resumed from an
earlier checkpoint can log its iterations again. The run id is kept in the checkpoint directory (--save), and a
run loading from it continues that W&B run. `wandb` is optional: missing, or failing to start, it is one warning
line and training goes on, or with --wandb-required one error line that stops the run.
"""
import logging
import os
from typing import Mapping, Optional, Sequence

from megatron.checkpoint.file_names import WANDB_RUN_ID_FILE
from megatron.config.job import LoggingConfig
from megatron.errors import RunError
from megatron.files.atomic import write_text_atomically
from megatron.training.tensorboard_log import ITERATION, SAMPLES, TOKENS, Point

_log = logging.getLogger(__name__)


class WandbWriter:
    """A started W&B run as a tensorboard_log.ScalarWriter: one W&B row per event, the tags it has not seen before
    declared against their axis first."""
    writes_throughput = True

    def __init__(self, run):
        self.run = run
        self.declared = set()
        for axis in (ITERATION, SAMPLES, TOKENS):
            run.define_metric(axis)

    def write(self, points: Sequence[Point], flush: bool) -> None:
        """`flush` needs nothing: W&B's own process writes each row as it comes."""
        row = {}
        for point in points:
            if point.tag not in self.declared:
                self.run.define_metric(point.tag, step_metric=point.axis)
                self.declared.add(point.tag)
            row[point.tag] = point.value
            row[point.axis] = point.x
        self.run.log(row)

    def close(self) -> None:
        self.run.finish()


def wandb_directory(logging_config: LoggingConfig, save: Optional[str]) -> str:
    return logging_config.wandb_save_dir or os.path.join(save, "wandb")


def recorded_run_id(checkpoint_dir: Optional[str]) -> Optional[str]:
    """The W&B run id a run that saved to `checkpoint_dir` kept there; None when there is none."""
    path = checkpoint_dir and os.path.join(checkpoint_dir, WANDB_RUN_ID_FILE)
    if not path or not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as handle:
        return handle.read().strip() or None


def start_wandb(logging_config: LoggingConfig, load: Optional[str], save: Optional[str],
                run_config: Mapping[str, object]) -> Optional[WandbWriter]:
    """A W&B run for this training run (the one the checkpoint in `load` logged to, if it kept one), its config
    `run_config`; None when W&B is off or could not start and is not required."""
    if not (logging_config.wandb_project or logging_config.wandb_exp_name):
        return None
    try:
        import wandb
    except ImportError:
        return _not_started(logging_config, "the wandb package is not installed (pip install wandb, or "
                                            "`pip install -e .[wandb]` in this repository)")
    directory = wandb_directory(logging_config, save)
    run_id = recorded_run_id(load)
    os.makedirs(directory, exist_ok=True)
    try:
        run = wandb.init(project=logging_config.wandb_project or None, name=logging_config.wandb_exp_name or None,
                         entity=logging_config.wandb_entity, dir=directory, config=dict(run_config), id=run_id,
                         resume="allow" if run_id else None)
    except Exception as error:  # wandb's own errors and the network's: the boundary of an optional service
        return _not_started(logging_config, f"W&B did not start: {type(error).__name__}: {error}")
    if save:
        os.makedirs(save, exist_ok=True)
        write_text_atomically(os.path.join(save, WANDB_RUN_ID_FILE), run.id + "\n")
    resumed = "continues" if run_id else "starts"
    if run.settings.mode == "offline":
        _log.info("W&B: %s run %s offline in %s; upload it with `wandb sync %s`", resumed, run.id,
                  run.settings.sync_dir, run.settings.sync_dir)
    else:
        _log.info("W&B: %s run %s: %s", resumed, run.id, run.url)
    return WandbWriter(run)


def _not_started(logging_config: LoggingConfig, reason: str) -> None:
    if logging_config.wandb_required:
        raise RunError(f"{reason}; --wandb-required stops the run: fix it, or drop --wandb-required to train "
                       "without W&B")
    _log.warning("%s; training goes on without W&B (--wandb-required would stop it)", reason)
