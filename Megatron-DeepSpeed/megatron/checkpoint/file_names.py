"""The names of a checkpoint directory's files and keys: the one place that spells them, for the trainer's save and
load and for the tools that read and write checkpoints outside it.

Checkpoints are written as upstream Megatron-DeepSpeed (b4d4a0e, megatron/checkpointing.py and
model/gpt_model.py) writes them under DeepSpeed, so its tools read ours and its checkpoints resume here:
  global_step{N}/layer_{NN}-model_{tp:02d}-model_states.pt   pipeline engine: one file per spec position with
        parameters (embedding 01, transformer layers 03..L+2, the final LayerNorm L+4; model/pipe.py)
  global_step{N}/mp_rank_{mp:02d}_model_states.pt   DeepSpeed's bookkeeping and the client state below; under
        the plain engine also `module`, nested as GPTModel.state_dict_for_save_checkpoint nests it
  global_step{N}/[bf16_]zero_pp_rank_{dp}_mp_rank_{mp:02d}_optim_states.pt   ZeRO partitions
  latest, latest_checkpointed_iteration.txt
The Megatron layout (what upstream's deepspeed_to_megatron.py and Megatron-LM write) is
  iter_{N:07d}/mp_rank_{tp:02d}[_{pp:03d}]/model_optim_rng.pt (or release/...) and
  latest_checkpointed_iteration.txt holding N or 'release'.
DeepSpeed's universal checkpoints (ds_to_universal, or our writer) keep zero/<parameter>/{fp32,...}.pt next to
the mp_rank files; `latest_universal` names their tag.
"""
import re

LATEST_TAG_FILE = "latest"  # DeepSpeed's: the tag (global_stepN) of the newest complete checkpoint
LATEST_ITERATION_FILE = "latest_checkpointed_iteration.txt"  # Megatron's: that checkpoint's iteration
LATEST_UNIVERSAL_FILE = "latest_universal"
RELEASE = "release"  # Megatron: latest_checkpointed_iteration.txt's word for a release checkpoint
# Saves before the pointers were plain files linked both through `.latest` -> `.latest.global_stepN/`; such
# directories still resume, and the next save removes these (checkpoint/trainer/save.py)
OLD_POINTER_LINK = ".latest"
OLD_POINTER_DIR_PREFIX = ".latest."
# An iteration number as a pointer file may write it: ASCII digits only (str.isdigit takes '²', int() refuses
# thousands of digits), short enough to be an iteration.
ITERATION_PATTERN = re.compile(r"[0-9]{1,18}")
# A checkpoint's name, whole (fullmatch): global_stepN, or with a suffix such as ds_to_universal's
# `global_stepN_universal`; one path component, never '..' or a path.
TAG_PATTERN = re.compile(r"global_step([0-9]{1,18})(?![0-9])[A-Za-z0-9_.-]*")
WANDB_RUN_ID_FILE = "wandb_run_id"  # the W&B run a resumed run continues (megatron/training/wandb_log.py)
UNIVERSAL_DIR = "zero"  # per-parameter state of a universal checkpoint (DeepSpeed's universal layout)
UNIVERSAL_MARK = "universal_checkpoint"  # client-state key of our writer's checkpoints: they load at any DP/ZeRO
OPTIMIZER_SAVED = "optimizer_saved"  # client-state key, False when saved with --no-save-optim
# client-state key of a converted MoE checkpoint: the precision (fp32, fp16, bf16) its expp_rank files load into at
# ZeRO 0; absent: fp32, the only form earlier converters wrote
OPTIMIZER_PRECISION = "optimizer_precision"
# client-state key of a converted MoE checkpoint: the data-parallel size its ZeRO 1-2 optimizer files were cut for
# (absent: none written)
OPTIMIZER_DATA_PARALLEL_SIZE = "optimizer_data_parallel_size"
MOMENTS = ("exp_avg", "exp_avg_sq")  # Adam's state per parameter besides the step, as torch names it

# Client state, as upstream's save_checkpoint hands it to DeepSpeed.
ARGS = "args"  # an argparse.Namespace of the flags under upstream's names
CHECKPOINT_VERSION = "checkpoint_version"
CHECKPOINT_VERSION_VALUE = 3.0  # fused QKV rows ordered [heads, (q, k, v), head_dim]
ITERATION = "iteration"
TOKENS = "tokens"  # consumed training tokens
CONSUMED_TRAIN_SAMPLES = "consumed_train_samples"  # a field of `args`, as upstream keeps it
GATE_UP_ROWS = "swiglu_gate_up_rows"  # a field of `args` we add: how a --swiglu model's dense_h_to_4h rows are held
RANDOM_RNG_STATE = "random_rng_state"
NP_RNG_STATE = "np_rng_state"
TORCH_RNG_STATE = "torch_rng_state"
CUDA_RNG_STATE = "cuda_rng_state"  # the accelerator's generator, whichever it is
RNG_TRACKER_STATES = "rng_tracker_states"
UNIVERSAL_CHECKPOINT_INFO = "universal_checkpoint_info"  # what DeepSpeed's ds_to_universal needs
# Written by earlier versions of this project (no checkpoint_version; args a dict; layer files from layer_00,
# final LayerNorm keys final_layernorm.*, attention named `attention`).
OLD_RNG_STATE = "rng_state"  # {python, numpy, torch, device}
OLD_TRACKER_STATES = "tensor_parallel_rng_state"
OLD_ATTENTION = ".attention."

# The plain engine's `module` and the Megatron layout's `model`, nested as upstream's GPTModel nests them.
LANGUAGE_MODEL = "language_model"
EMBEDDING = "embedding"
ENCODER = "encoder"
OUTPUT_LAYER = "output_layer"  # an untied LM head's (upstream's TransformerLanguageModel.output_layer)
MEGATRON_MODEL = "model"
MEGATRON_FILE = "model_optim_rng.pt"
MEGATRON_ITER_PATTERN = re.compile(r"iter_(\d{7})")


def model_parallel_rank(pp_rank: int, tp_rank: int, tp_size: int) -> int:
    return pp_rank * tp_size + tp_rank


def model_states_file(mp_rank: int, zero_stage: int, dp_rank: int = 0) -> str:
    if zero_stage == 3:
        return f"zero_pp_rank_{dp_rank}_mp_rank_{mp_rank:02d}_model_states.pt"
    return f"mp_rank_{mp_rank:02d}_model_states.pt"


def optimizer_states_file(mp_rank: int, dp_rank: int, bf16: bool = False) -> str:
    return f"{'bf16_' if bf16 else ''}zero_pp_rank_{dp_rank}_mp_rank_{mp_rank:02d}_optim_states.pt"


def layer_file(position: int, tp_rank: int) -> str:
    """The file of pipeline spec position `position` (model/pipe.py numbers them as upstream)."""
    return f"layer_{position:02d}-model_{tp_rank:02d}-model_states.pt"


def megatron_iteration_dir(iteration: int, release: bool = False) -> str:
    return RELEASE if release else f"iter_{iteration:07d}"


def megatron_rank_dir(tp_rank: int, pp_rank: int, pp_size: int) -> str:
    return f"mp_rank_{tp_rank:02d}" if pp_size == 1 else f"mp_rank_{tp_rank:02d}_{pp_rank:03d}"

# DeepSpeed's MoE layout: each expert of each MoE layer (numbered from 0 in model order) in a file of its own, per
# model-parallel rank; its keys are the parameter names under the engine module's MoE layer path (ours, or
# upstream's longer one: checkpoint/parameter_names.upstream_expert_key) with the expert's global index.
EXPERT_FILE_PATTERN = re.compile(r"layer_(\d+)_expert_(\d+)_mp_rank_(\d+)_model_states\.pt")
# An expert's parameter name: its transformer layer and its global expert index.
EXPERT_KEY_PATTERN = re.compile(r"layers\.(\d+)\..*\.deepspeed_moe\.experts\.deepspeed_experts\.(\d+)\.")


def expert_file(moe_layer: int, expert: int, mp_rank: int) -> str:
    """The file DeepSpeed reads expert `expert` (global index) of the `moe_layer`-th MoE layer from."""
    return f"layer_{moe_layer}_expert_{expert}_mp_rank_{mp_rank:02d}_model_states.pt"


def expert_optimizer_file(expert_parallel_rank: int, mp_rank: int) -> str:
    """The file DeepSpeed keeps an MoE model's optimizer state in at ZeRO stage 0, per expert-parallel rank."""
    return f"expp_rank_{expert_parallel_rank}_mp_rank_{mp_rank:02d}_optim_states.pt"


MANIFEST_FILE = "manifest.json"  # in each global_stepN: its files, sizes and checksums (checkpoint/manifest.py)
