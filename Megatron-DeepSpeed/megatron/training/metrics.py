"""Figures about the model and optimizer that the logging flags report: parameter norm, zeros among the
gradients, Adam's moment statistics. The first two count every parameter once per model replica (see
counted_once_per_replica), then sum over the ranks that hold different pieces of the replica."""
import torch
import torch.distributed as dist
from deepspeed.moe.utils import is_moe_param
from deepspeed.utils import groups

from megatron import device


def counted_once_per_replica(parameter, tp_rank: int) -> bool:
    """Whether this rank's copy of `parameter` is the one that counts: tensor-parallel shards on every rank,
    replicated parameters on tensor-parallel rank 0, a tied pipeline weight on the stage that owns it."""
    if getattr(parameter, "ds_pipe_replicated", False):
        return False
    return tp_rank == 0 or getattr(parameter, "tensor_model_parallel", False)


def _local_piece(parameter) -> torch.Tensor:
    """The part of a parameter this rank holds: ZeRO-3 keeps only a partition (ds_tensor)."""
    return getattr(parameter, "ds_tensor", parameter)


def parameters_norm(model: torch.nn.Module, parallel) -> float:
    """L2 norm of all parameters of the model (--log-params-norm); a collective over the model-parallel group,
    and over the data-parallel group when ZeRO-3 partitions the parameters (over all ranks for MoE experts)."""
    squares = torch.zeros((), dtype=torch.float32, device=device.current_device())
    partitioned = False
    for parameter in model.parameters():
        partitioned = partitioned or hasattr(parameter, "ds_tensor")
        if not is_moe_param(parameter) and counted_once_per_replica(parameter, parallel.tp_rank):
            squares += _local_piece(parameter).detach().float().pow(2).sum()
    if partitioned:
        dist.all_reduce(squares, group=parallel.get_sequence_data_parallel_group())  # ZeRO's partitions
    dist.all_reduce(squares, group=parallel.get_model_parallel_group())
    return (squares + expert_squares(model)).sqrt().item()


def expert_squares(model: torch.nn.Module, gradients: bool = False) -> torch.Tensor:
    """Sum of squares of the MoE experts' weights (or their gradients), each expert counted once (a collective
    over all ranks when the model has experts). Ranks of one expert-data-parallel group hold the same experts with
    the same values (gradients once reduced); the others hold different experts or, with experts split over the
    tensor-parallel ranks, other shards of them, beside the pieces every tensor-parallel rank holds whole (the
    second linear's bias). So the sum over every rank counts each value once per rank holding it."""
    total = torch.zeros((), dtype=torch.float32, device=device.current_device())
    experts = [p for p in model.parameters() if is_moe_param(p) and (p.grad is not None or not gradients)]
    if not experts:
        return total
    expert_tensor_parallel = groups._get_expert_model_parallel_world_size()  # 1 unless experts are split
    for parameter in experts:
        copies = groups._get_expert_data_parallel_world_size(parameter.group_name)
        if not getattr(parameter, "tensor_model_parallel", False):
            copies *= expert_tensor_parallel
        total += (parameter.grad if gradients else parameter).detach().float().pow(2).sum() / copies
    dist.all_reduce(total)
    return total


def zeros_among(gradients) -> torch.Tensor:
    """How many gradient entries are exactly zero (--log-num-zeros-in-grad), as a float tensor."""
    total = torch.zeros((), dtype=torch.float32, device=device.current_device())
    for gradient in gradients:
        total += (gradient == 0).sum()
    return total


OPTIMIZER_STATE_TAGS = ("variance_l2", "variance_sqrt_l2", "momentum_l2", "weight_l2", "variance_l1",
                        "variance_sqrt_l1", "momentum_l1", "weight_l1", "variance_abs_max", "variance_sqrt_abs_max",
                        "momentum_abs_max", "weight_abs_max")


def optimizer_state_statistics(optimizer: torch.optim.Optimizer, parallel, partitioned: bool) -> dict:
    """Norms and extremes of Adam's moments (exp_avg = momentum, exp_avg_sq = variance) and of the weights it
    steps (--log-optimizer-states-to-tensorboard), by upstream's definitions and names. Its parameters may be
    ZeRO's flat partitions, which carry no tensor-parallel marks, so as upstream the figures are summed over
    the model-parallel group (a replicated weight counts once per tensor-parallel rank) and, when
    `partitioned` (ZeRO splits the state), over the data-parallel group. A collective over those groups."""
    sums = torch.zeros(8, dtype=torch.float32)
    maxima = torch.zeros(4, dtype=torch.float32)
    for group in optimizer.param_groups:
        for weight in group["params"]:
            state = optimizer.state.get(weight, {})
            if "exp_avg" not in state:
                continue
            pieces = (state["exp_avg_sq"].float(), state["exp_avg_sq"].float().sqrt(), state["exp_avg"].float(),
                      weight.detach().float())
            for index, piece in enumerate(pieces):
                sums[index] += piece.pow(2).sum().item()
                sums[4 + index] += piece.abs().sum().item()
                maxima[index] = max(maxima[index].item(), piece.abs().max().item())
    groups = [parallel.get_model_parallel_group()]
    if partitioned:
        groups.append(parallel.get_sequence_data_parallel_group())  # ZeRO's partitions
    target = device.current_device()
    sums, maxima = sums.to(target), maxima.to(target)
    for group in groups:
        dist.all_reduce(sums, group=group)
        dist.all_reduce(maxima, op=dist.ReduceOp.MAX, group=group)
    sums, maxima = sums.cpu(), maxima.cpu()
    values = [sums[i].sqrt().item() for i in range(4)] + [sums[i].item() for i in range(4, 8)] + maxima.tolist()
    return dict(zip(OPTIMIZER_STATE_TAGS, values))


def stepped_optimizer(engine_optimizer) -> torch.optim.Optimizer:
    """The torch optimizer inside DeepSpeed's wrappers (ZeRO, fp16, bf16 keep the one they were given as
    `.optimizer`): the one whose state holds Adam's moments."""
    optimizer = engine_optimizer
    while not isinstance(optimizer, torch.optim.Optimizer) and hasattr(optimizer, "optimizer"):
        optimizer = optimizer.optimizer
    return optimizer
