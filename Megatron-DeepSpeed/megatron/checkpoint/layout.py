"""The names of a checkpoint directory's files and keys: the one place that spells them, for the trainer's save and
load and for the tools that read and write checkpoints outside it."""
import re

LATEST_TAG_FILE = "latest"  # DeepSpeed's: the tag (global_stepN) of the newest complete checkpoint
LATEST_ITERATION_FILE = "latest_checkpointed_iteration.txt"  # Megatron's: that checkpoint's iteration
LATEST_UNIVERSAL_FILE = "latest_universal"
POINTER_LINK = ".latest"  # both pointer files link through it (checkpoint/save_load.py)
POINTER_DIR_PREFIX = ".latest."
TAG_PATTERN = re.compile(r"global_step(\d+)")
UNIVERSAL_DIR = "zero"  # per-parameter state of a checkpoint written by writer.py (DeepSpeed's universal layout)
UNIVERSAL_MARK = "universal_checkpoint"  # client-state key of such a checkpoint: it loads at any DP and ZeRO stage
OPTIMIZER_SAVED = "optimizer_saved"  # client-state key, False when saved with --no-save-optim
