"""The forms DeepSpeed 0.19.8 saves an fp16/bf16 run's Adam state in at ZeRO stage 0 (the engine's
'optimizer', its optimizer's state_dict(): in the mp_rank files of a dense model, engine.py
_common_checkpoint_state, and the expp_rank files of an MoE one), read per parameter.

engine.py _do_optimizer_sanity_check picks the wrapper from the model and gradient dtypes:
  fp32             none: torch's AdamW state_dict.
  fp16, or bf16 on the plain engine   _configure_fp16_optimizer: FP16_UnfusedOptimizer for torch's AdamW (ours;
                   runtime/fp16/unfused_optimizer.py state_dict): the loss-scale keys, 'optimizer_state_dict' (torch's,
                   numbered as in fp32) and 'fp32_groups' (the master copies, one list per group, no padding). Its
                   constructor (initialize_optimizer_states) steps AdamW once with zero gradients, so every
                   parameter has state and AdamW's step is one more than the iterations. FP16_Optimizer for
                   DeepSpeed's FusedAdam (upstream's trainer; runtime/fp16/fused_optimizer.py state_dict): the same
                   keys, but each group one flat parameter, its members concatenated without padding, with one
                   AdamW entry and one 'fp32_groups_flat' tensor per group.
  bf16 on the pipeline engine   BF16_Optimizer (runtime/bf16_optimizer.py state_dict), ZeRO-1-like: each group
                   flattened (members unpadded, the end padded to a multiple of 2 x the data-parallel size) and cut
                   into one slice per data-parallel rank, each rank's in bf16_zero_pp_rank_{dp}_mp_rank_{mp:02d}_
                   optim_states.pt (engine.py _save_zero_checkpoint, as ZeRO 1's: 'base_optimizer_state',
                   'single_partition_of_fp32_groups'); the mp_rank file's 'optimizer' holds rank 0's again. Its
                   step counts the iterations.
The converter writes FP16_UnfusedOptimizer's form (zero0_state, target_loss_scale) for a ZeRO-0 run in fp16 or
bf16 that wraps torch's AdamW in it: any run of the plain engine, and the pipeline engine's in fp16.
Established with this trainer's bf16 runs (plain and pipeline engine, PP 2 and DP 2) and DeepSpeed's fp16
classes' own state_dict() (tests/checkpoint/formats/test_mixed_precision_state.py,
tests/checkpoint/reshape/test_moe_conversion.py).
"""
from typing import Callable, List, Mapping, Optional, Sequence

import torch

from megatron.checkpoint.file_names import MOMENTS
from megatron.config.recorded_flags import RecordedFlags
from megatron.errors import InputError

WRAPPED_STATE = "optimizer_state_dict"
MASTER_WEIGHTS = "fp32_groups"
FLAT_MASTER_WEIGHTS = "fp32_groups_flat"
LOSS_SCALE_KEYS = ("dynamic_loss_scale", "cur_scale", "cur_iter", "last_overflow_iter", "scale_factor",
                   "scale_window")
PARTITIONED_STATE = "base_optimizer_state"  # BF16_Optimizer's (and ZeRO 1-2's) torch state of the flat slices
# LossScaleConfig's scale_factor (runtime/fp16/loss_scaler.py, both profiles); a fresh dynamic scale has not
# overflowed yet (last_overflow_iter -1)
SCALE_FACTOR = 2.0


def partitioned(saved: Mapping) -> bool:
    """Whether a ZeRO-0 'optimizer' is BF16_Optimizer's, whose state lies in the data-parallel slices."""
    return PARTITIONED_STATE in saved


def torch_state(saved: Mapping) -> Mapping:
    """torch's AdamW state_dict in a ZeRO-0 'optimizer': itself in fp32, inside the fp16/bf16 wrapper."""
    return saved[WRAPPED_STATE] if WRAPPED_STATE in saved else saved


def adam_state(saved: Mapping) -> Mapping:
    """torch's AdamW state_dict in any ZeRO-0 'optimizer' (BF16_Optimizer's: of its flat slices)."""
    return saved[PARTITIONED_STATE] if partitioned(saved) else torch_state(saved)


def per_parameter(saved: Mapping, shapes: Sequence[Sequence[torch.Size]], where: str) -> Mapping:
    """A ZeRO-0 'optimizer' in torch's or FP16_UnfusedOptimizer's form: FP16_Optimizer's flat groups cut into
    their members (`shapes`: each group's, in torch's order; `where` names the file for an error), views."""
    return _unflattened(saved, shapes, where) if FLAT_MASTER_WEIGHTS in saved else saved


def master_weights(saved: Mapping) -> List[torch.Tensor]:
    """The fp32 master copies of a per_parameter form, numbered as torch numbers the state (none in fp32)."""
    return [tensor for group in saved.get(MASTER_WEIGHTS, ()) for tensor in group]


def loss_scale(saved: Mapping, value: Callable[[object], object] = lambda number: number) -> Optional[dict]:
    """The loss scale a wrapper saved (bf16: unscaled, but its keys are there); None for torch's state. `value`
    reads a number (tensor_records.FileSections.scalar, for contents parsed onto the meta device)."""
    return {key: value(saved[key]) for key in LOSS_SCALE_KEYS if key in saved} if WRAPPED_STATE in saved else None


def _unflattened(saved: Mapping, shapes: Sequence[Sequence[torch.Size]], where: str) -> dict:
    adam, flat_masters = saved[WRAPPED_STATE], saved[FLAT_MASTER_WEIGHTS]
    if len(flat_masters) != len(shapes) or any(flat.numel() != sum(shape.numel() for shape in group)
                                               for flat, group in zip(flat_masters, shapes)):
        raise InputError(f"{where} holds the flat optimizer groups of another model than its weights; convert it "
                         "with --weights-only")
    state, masters, param_groups, first = {}, [], [], 0
    for number, group_shapes in enumerate(shapes):
        sizes = [shape.numel() for shape in group_shapes]
        flat = adam["state"].get(number, {})
        pieces = {kind: flat[kind].split(sizes) for kind in MOMENTS if kind in flat}
        for position, shape in enumerate(group_shapes):
            if pieces:
                state[first + position] = {"step": flat["step"],
                                           **{kind: pieces[kind][position].view(shape) for kind in pieces}}
        masters.append([piece.view(shape) for piece, shape in zip(flat_masters[number].split(sizes), group_shapes)])
        param_groups.append({**adam["param_groups"][number], "params": list(range(first, first + len(sizes)))})
        first += len(sizes)
    return {**{key: saved[key] for key in LOSS_SCALE_KEYS if key in saved},
            WRAPPED_STATE: {"state": state, "param_groups": param_groups}, MASTER_WEIGHTS: masters}


def target_loss_scale(precision: str, args: Mapping[str, object], iteration: int,
                      source: Optional[Mapping] = None, source_precision: str = "fp32") -> Optional[dict]:
    """The loss-scale keys of the target's FP16_UnfusedOptimizer state (None for fp32: no wrapper). An fp16
    source's scale continues; otherwise the scale an engine of the recorded flags starts with (LossScaleConfig,
    the unfused profile DeepSpeed gives torch's AdamW; bf16 scales nothing). 'cur_iter' counts the steps taken:
    the source's count, or its iteration. (It is not AdamW's step: the wrapper's constructor steps AdamW once
    with zero gradients, so an fp16/bf16 run's AdamW counts one step more than its iterations.)"""
    if precision == "fp32":
        return None
    steps = int(source["cur_iter"]) if source is not None else iteration
    if precision == "bf16":
        return {"dynamic_loss_scale": False, "cur_scale": 1.0, "cur_iter": steps}
    if source is not None and source_precision == "fp16":
        return dict(source)
    scaler = RecordedFlags.of(args).loss_scaler
    if not scaler["dynamic_loss_scale"]:
        return {**scaler, "cur_iter": steps}
    return {"dynamic_loss_scale": True, "cur_scale": scaler["cur_scale"], "cur_iter": steps,
            "last_overflow_iter": -1, "scale_factor": SCALE_FACTOR, "scale_window": scaler["scale_window"]}


def zero0_state(groups: Sequence[tuple], shard: Callable[[str, str], torch.Tensor], step: int,
                scale: Optional[Mapping]) -> Mapping:
    """What a ZeRO-0 engine loads as its 'optimizer', for a rank with optimizer `groups` ((hyperparameters,
    member names in torch's order) each): torch's AdamW state_dict (fp32, `scale` None), or that state_dict
    wrapped as FP16_UnfusedOptimizer saves it, beside the master weights and the loss scale (`scale`,
    target_loss_scale's). shard(kind, name) is the rank's tensor of one kind (fp32, exp_avg, exp_avg_sq)."""
    ordered = [name for _, members in groups for name in members]
    state = {index: {"step": torch.tensor(float(step)), **{kind: shard(kind, name).clone() for kind in MOMENTS}}
             for index, name in enumerate(ordered)}
    torch_groups, first = [], 0
    for hyper, members in groups:
        torch_groups.append({**hyper, "params": list(range(first, first + len(members)))})
        first += len(members)
    adam = {"state": state, "param_groups": torch_groups}
    if scale is None:
        return adam
    return {**scale, WRAPPED_STATE: adam,
            MASTER_WEIGHTS: [[shard("fp32", name).clone() for name in members] for _, members in groups]}
