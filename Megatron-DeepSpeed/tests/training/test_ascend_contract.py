"""The optimizer half of the Ascend contract, checked on a CPU host against the installed DeepSpeed.

Whatever the device (CPU, CUDA, or an Ascend host with torch_npu, whose adaptor offers kernels), the trainer's
Adam must be one that DeepSpeed's ZeRO accepts (DeepSpeed's own check, not a copy of its list) and one that reads
the gradients of every step: stepped through the real DeepSpeed engine with three different gradients, the
weights must move as plain single-tensor AdamW moves them. CombinedBuffersAdamW stands for torch_npu's
NpuFusedOptimizerBase and must fail both, or the check could not catch it.
"""
import types

import pytest
import torch
from deepspeed.runtime.zero.utils import is_zero_supported_optimizer
from tests.helpers.distributed import run_on_ranks

from deepspeed_npu.fused_kernels import npu_kernels
from megatron.config.arguments import job_config, parse_args, validate_args
from megatron.config.ds_config import build_deepspeed_config
from megatron.model.kernels import select_kernels
from megatron.training.optimizer import build_optimizer, parameter_groups

FLAGS = ["--num-layers", "1", "--hidden-size", "8", "--num-attention-heads", "2", "--seq-length", "8",
         "--micro-batch-size", "1", "--global-batch-size", "1", "--lr", "0.05", "--train-iters", "3", "--mock-data",
         "--tokenizer-type", "NullTokenizer", "--vocab-size", "16", "--clip-grad", "0", "--no-pipeline-parallel"]
STAGES = (0, 1, 2)
# Trained through the engine: here the CPU gets the fused form and an NPU (no op-plugin kernel in this process)
# the foreach form, so both forms of the trainer's rule are stepped. CUDA's choice is checked for ZeRO support.
TRAINED = ("cpu", "npu")


class CombinedBuffersAdamW(torch.optim.Optimizer):
    """What torch_npu's NpuFusedOptimizerBase does (torch_npu/optim/npu_fused_optim_base.py, Ascend/pytorch
    9e73e708ab9350d203475609f36f8a43f6a0c2ab), in plain torch: on the first step every parameter and its gradient
    are moved into one combined buffer each (npu_combine_tensors re-points their storage), and every step after
    updates only those buffers, with AdamW's arithmetic."""

    def __init__(self, params, lr, betas, eps, weight_decay):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self._combined = None  # (parameters, gradients, exp_avg, exp_avg_sq, per-element decay), first step on

    def _combine(self):
        params = [p for group in self.param_groups for p in group["params"] if p.grad is not None]
        flat_params = torch.cat([p.detach().reshape(-1) for p in params])
        flat_grads = torch.cat([p.grad.reshape(-1) for p in params])
        decay = torch.cat([torch.full((p.numel(),), group["weight_decay"]) for group in self.param_groups
                           for p in group["params"] if p.grad is not None])
        offset = 0
        for p in params:  # the tensors now live inside the buffers, as after npu_change_data_ptr
            p.data = flat_params[offset:offset + p.numel()].view_as(p)
            p.grad.data = flat_grads[offset:offset + p.numel()].view_as(p)
            offset += p.numel()
        self._combined = (flat_params, flat_grads, torch.zeros_like(flat_params), torch.zeros_like(flat_params),
                          decay)

    @torch.no_grad()
    def step(self, closure=None):
        if self._combined is None:
            self._combine()
        flat_params, flat_grads, exp_avg, exp_avg_sq, decay = self._combined
        group = self.param_groups[0]
        self.state["step"] = step = self.state.get("step", 0) + 1
        beta1, beta2 = group["betas"]
        flat_params.mul_(1 - group["lr"] * decay)
        exp_avg.mul_(beta1).add_(flat_grads, alpha=1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(flat_grads, flat_grads, value=1 - beta2)
        denominator = (exp_avg_sq / (1 - beta2 ** step)).sqrt_().add_(group["eps"])
        flat_params.addcdiv_(exp_avg, denominator, value=-group["lr"] / (1 - beta1 ** step))


def npu_host_kernels():
    """The kernels deepspeed_npu offers on an Ascend910B3 host whose torch_npu has NpuFusedAdamW."""
    torch_npu = types.SimpleNamespace(npu_fusion_attention=lambda *args, **kwargs: None,
                                      optim=types.SimpleNamespace(NpuFusedAdamW=CombinedBuffersAdamW))
    return npu_kernels(torch_npu, "Ascend910B3")


def trainer_adam(device_name):
    """The Adam the trainer builds on `device_name` (with the adaptor's kernels on an NPU host)."""
    return select_kernels(device_name, npu_host_kernels() if device_name == "npu" else None).adam


def trainer_optimizer(device_name):
    """The optimizer the trainer builds over a tiny model on `device_name`."""
    return build_optimizer(tiny_model(), job(1).optimizer, select_kernels(
        device_name, npu_host_kernels() if device_name == "npu" else None))


def job(stage):
    return job_config(validate_args(parse_args(FLAGS + ["--zero-stage", str(stage)]), 1, "cpu"))


def tiny_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))


def batches():
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(2, 4, generator=generator), torch.randn(2, 2, generator=generator)) for _ in range(3)]


def weights_after_each_step(adam, stage):
    """Three steps of DeepSpeed's engine (the trainer's DeepSpeed config at ZeRO `stage`), each on a new batch,
    with the optimizer `adam` builds; the weights after each step. Refusal is returned as the error's text."""
    import deepspeed
    config = job(stage)
    model = tiny_model()
    optimizer = adam(parameter_groups(model, config.optimizer.weight_decay), lr=config.optimizer.lr,
                     betas=(config.optimizer.adam_beta1, config.optimizer.adam_beta2), eps=config.optimizer.adam_eps,
                     weight_decay=config.optimizer.weight_decay)
    try:
        engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=build_deepspeed_config(config),
                                               dist_init_required=False)
    except AssertionError as refused:
        return str(refused)
    history = []
    for inputs, targets in batches():
        engine.backward(((engine(inputs) - targets) ** 2).sum())
        engine.step()
        history.append([p.detach().clone() for p in engine.module.parameters()])
    return history


def plain_adamw_weights():
    """The same three steps with torch's single-tensor AdamW and no engine: the reference."""
    config = job(0).optimizer
    model = tiny_model()
    optimizer = torch.optim.AdamW(parameter_groups(model, config.weight_decay), lr=config.lr,
                                  betas=(config.adam_beta1, config.adam_beta2), eps=config.adam_eps,
                                  foreach=False, fused=False)
    history = []
    for inputs, targets in batches():
        optimizer.zero_grad()
        ((model(inputs) - targets) ** 2).sum().backward()
        optimizer.step()
        history.append([p.detach().clone() for p in model.parameters()])
    return history


def every_outcome():
    """DeepSpeed's ZeRO support check on the optimizer each device gets and on the stand-in; then each form the
    trainer's rule can choose, and the stand-in, stepped at ZeRO 0, 1 and 2 (one process: DeepSpeed's check
    logs through its process group, and the engine's start-up cost is paid once)."""
    import deepspeed
    deepspeed.init_distributed(dist_backend="gloo", verbose=False)  # DeepSpeed's view of the group joined
    accepted = {device_name: is_zero_supported_optimizer(trainer_optimizer(device_name))
                for device_name in ("cpu", "cuda", "npu")}
    accepted["combined buffers"] = is_zero_supported_optimizer(CombinedBuffersAdamW(tiny_model().parameters(), 0.1,
                                                                                    (0.9, 0.99), 1e-8, 0.0))
    runs = [(device_name, trainer_adam(device_name), stage) for device_name in TRAINED for stage in STAGES]
    runs += [("combined buffers", CombinedBuffersAdamW, stage) for stage in (0, 1)]
    return accepted, {(name, stage): weights_after_each_step(adam, stage) for name, adam, stage in runs}


@pytest.fixture(scope="module")
def outcomes():
    [(accepted, steps)] = run_on_ranks(every_outcome, 1, timeout=300)
    return accepted, steps, plain_adamw_weights()


def moves_as_plain_adamw(history, reference):
    return not isinstance(history, str) and all(
        torch.allclose(ours, theirs, rtol=1e-5, atol=1e-6)
        for step, reference_step in zip(history, reference) for ours, theirs in zip(step, reference_step))


@pytest.mark.parametrize("device_name", ["cpu", "cuda", "npu"])
def test_the_adam_chosen_on_every_device_is_accepted_by_zero(outcomes, device_name):
    accepted, _, _ = outcomes
    assert accepted[device_name]  # DeepSpeed's own check (exact type), which every ZeRO stage above 0 applies
    assert type(trainer_optimizer(device_name)) is torch.optim.AdamW
    options = trainer_optimizer(device_name).defaults
    assert options["fused"] or options["foreach"]


def test_the_trained_devices_cover_both_forms_of_the_rule():
    assert {next(iter(trainer_adam(device_name).keywords)) for device_name in TRAINED} == {"fused", "foreach"}


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("device_name", TRAINED)
def test_the_adam_chosen_trains_on_every_steps_gradients_under_zero(outcomes, device_name, stage):
    _, steps, reference = outcomes
    assert moves_as_plain_adamw(steps[(device_name, stage)], reference)


def test_an_optimizer_that_combines_buffers_fails_both_checks(outcomes):
    accepted, steps, reference = outcomes
    assert not accepted["combined buffers"]
    assert "untested ZeRO Optimizer" in steps[("combined buffers", 1)]
    stale = steps[("combined buffers", 0)]  # ZeRO 0 takes any optimizer: it then trains on step 1's gradients
    assert moves_as_plain_adamw(stale[:1], reference[:1])
    assert not moves_as_plain_adamw(stale, reference)
