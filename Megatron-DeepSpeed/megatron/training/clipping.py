"""Gradient clipping for DeepSpeed's plain fp32 path (ZeRO 0, no fp16/bf16), run as a step pre-hook of the
optimizer, after gradients are reduced over data-parallel ranks (and tied pipeline stages).

DeepSpeed clips that path itself but keeps no norm to report, and under pipeline parallelism its norm counts
replicated parameters from the first stage only, so later stages' parameters are left out. Here every
parameter counts once per model replica: tensor-parallel shards on every rank, replicated parameters on
tensor-parallel rank 0, a tied pipeline weight on the stage that owns it, each expert of an MoE layer once
(training/metrics.py, expert_squares). DeepSpeed's own clipping is then switched off (gradient_clipping 0 in
its config).

A non-finite norm skips the step, as DeepSpeed's other paths do (see megatron/training/divergence.py). The
work is a few fused (foreach) calls whatever the parameter count, and the host never waits for the device:
the norm, the zero count and the skipped-step count stay tensors until the loop logs them, and with torch's
fused optimizers a bad step is skipped on the device through `found_inf` (as NonFiniteStepGuard does, on the
devices whose kernel reads it). Other optimizers and devices read the verdict and drop the gradients, which
makes them leave every parameter and its state alone. The norm is the same on every rank, so every rank skips.
"""
from typing import Optional

import torch
import torch.distributed as dist
from deepspeed.moe.utils import is_moe_param

from megatron import device
from megatron.model.kernels import step_reads_found_inf
from megatron.training.metrics import counted_once_per_replica, expert_squares, zeros_among


class Fp32GradientClipping:
    def __init__(self, model: torch.nn.Module, parallel, max_norm: float, count_zeros: bool = False):
        self.parameters = [p for p in model.parameters() if p.requires_grad]
        self.counted = [not is_moe_param(p) and counted_once_per_replica(p, parallel.tp_rank)
                        for p in self.parameters]
        self.model = model
        self.has_experts = any(is_moe_param(p) for p in self.parameters)
        group = parallel.get_model_parallel_group()
        self.group = group if dist.get_world_size(group) > 1 else None  # one rank: nothing to sum
        self.max_norm, self.count_zeros = max_norm, count_zeros
        self.norm: Optional[torch.Tensor] = None  # of the last step, before clipping
        self.num_zeros: Optional[torch.Tensor] = None  # zero gradient entries of the last step, with count_zeros
        self.skipped: Optional[torch.Tensor] = None  # steps skipped so far

    @property
    def skipped_steps(self) -> int:
        return 0 if self.skipped is None else int(self.skipped.item())

    def __call__(self, optimizer, args, kwargs) -> None:
        stepped = [p for p in self.parameters if p.grad is not None]
        counted = [p.grad for p, counts in zip(self.parameters, self.counted) if counts and p.grad is not None]
        zero = torch.zeros((), dtype=torch.float32, device=device.current_device())
        norm = torch.nn.utils.get_total_norm(counted, foreach=True).float() if counted else zero
        figures = torch.stack([norm * norm, zeros_among(counted) if self.count_zeros else zero])
        if self.group is not None:
            dist.all_reduce(figures, group=self.group)
        squares = figures[0] + expert_squares(self.model, gradients=True) if self.has_experts else figures[0]
        self.norm = squares.sqrt()
        self.num_zeros = figures[1] if self.count_zeros else None
        bad = (~torch.isfinite(self.norm)).float()
        self.skipped = bad if self.skipped is None else self.skipped + bad
        if stepped and step_reads_found_inf(optimizer, stepped[0].device.type):
            optimizer.found_inf = bad
        elif bad.item():
            for parameter in stepped:
                parameter.grad = None
            return
        if self.max_norm > 0:
            torch.nn.utils.clip_grads_with_norm_(stepped, self.max_norm, self.norm, foreach=True)
