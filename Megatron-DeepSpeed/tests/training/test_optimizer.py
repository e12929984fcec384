"""The optimizer of --optimizer (megatron/training/optimizer.py): Megatron's two parameter groups (matrices
decayed, vectors not; frozen parameters left out), AdamW with the device's kernel or the CPU's under
--cpu-optimizer, and SGD with momentum and L2 decay. The optimizer against DeepSpeed's ZeRO and freshness checks:
test_ascend_contract.py."""
from dataclasses import replace

import torch

from megatron.config.job import OptimizerConfig
from megatron.model.kernels import PORTABLE_KERNELS
from megatron.training.optimizer import build_optimizer, parameter_groups

CONFIG = OptimizerConfig(lr=0.1, weight_decay=0.01, adam_beta1=0.8, adam_beta2=0.95, adam_eps=1e-6, clip_grad=1.0,
                         cpu_optimizer=False, optimizer="adam", sgd_momentum=0.5)


def model() -> torch.nn.Module:
    layers = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3), torch.nn.Linear(3, 2, bias=False))
    layers[2].weight.requires_grad_(False)
    return layers


def test_matrices_are_decayed_and_vectors_not():
    net = model()
    decayed, not_decayed = parameter_groups(net, 0.01)
    assert (decayed["name"], decayed["weight_decay"], not_decayed["name"], not_decayed["weight_decay"]) == (
        "decayed", 0.01, "not_decayed", 0.0)
    assert [id(p) for p in decayed["params"]] == [id(net[0].weight)]  # the frozen matrix is left out
    assert [id(p) for p in not_decayed["params"]] == [id(net[0].bias), id(net[1].weight), id(net[1].bias)]


class RecordingAdam(torch.optim.AdamW):
    """A device kernel that says it was chosen."""


def test_adam_takes_the_devices_kernel_and_the_cpus_under_offload():
    device_kernels = replace(PORTABLE_KERNELS, adam=RecordingAdam)
    adam = build_optimizer(model(), CONFIG, device_kernels)
    assert isinstance(adam, RecordingAdam)
    assert [group["weight_decay"] for group in adam.param_groups] == [0.01, 0.0]
    assert adam.defaults["betas"] == (0.8, 0.95) and adam.defaults["eps"] == 1e-6 and adam.defaults["lr"] == 0.1
    offloaded = build_optimizer(model(), replace(CONFIG, cpu_optimizer=True), device_kernels)
    assert isinstance(offloaded, torch.optim.AdamW) and not isinstance(offloaded, RecordingAdam)


def test_sgd_with_momentum_and_l2_decay():
    sgd = build_optimizer(model(), replace(CONFIG, optimizer="sgd"), PORTABLE_KERNELS)
    assert isinstance(sgd, torch.optim.SGD)
    assert (sgd.defaults["momentum"], sgd.defaults["weight_decay"]) == (0.5, 0.01)
    assert [group["weight_decay"] for group in sgd.param_groups] == [0.01, 0.0]
