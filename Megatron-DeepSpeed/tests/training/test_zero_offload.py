"""--cpu-optimizer (ZeRO's offload_optimizer to the CPU): DeepSpeed really keeps the optimizer state on the CPU and
steps it with torch's AdamW, and data-parallel training with offload equals single-process training (fp32,
dropout 0: losses within 1e-5 relative, same weights)."""
from dataclasses import replace

import pytest
import torch
from tests.helpers.distributed import run_on_ranks
from tests.helpers.training import COMMON, TINY_FLAGS, assert_same_training, train

from megatron.config.arguments import parse_args
from megatron.training.optimizer import build_optimizer

pytestmark = pytest.mark.full  # multi-process / whole-run tests: the full tier

OFFLOAD = ["--cpu-optimizer", "--no-pipeline-parallel"]


@pytest.mark.parametrize("stage", ["2", "3"])
def test_dp2_with_offloaded_optimizer_equals_single_process(stage, data_prefix, single_process):
    result = run_on_ranks(train, 2, [*COMMON, "--data-path", data_prefix, "--zero-stage", stage, *OFFLOAD])[0]
    assert_same_training(result, single_process)


def offloaded_engine_facts(stage: str) -> dict:
    """Build the engine as pretrain() does, take one step, and describe where its optimizer state lives."""
    from megatron.config.arguments import job_config, validate_args
    from megatron.data.gpt_batch import make_batch, model_inputs
    from megatron.model.kernels import select_kernels
    from megatron.model.provider import model_provider
    from megatron.parallel_state import ParallelState
    from megatron.tensor_parallel import tensor_parallel_rng_tracker
    from megatron.model.gpt_config import gpt_config
    from megatron.training.loop import build_engine

    argv = [*TINY_FLAGS, "--micro-batch-size", "2", "--global-batch-size", "2", "--train-iters", "3",
            "--mock-data", "--zero-stage", stage, *OFFLOAD]
    config = job_config(validate_args(parse_args(argv), 1, "cpu"))
    kernels = select_kernels("cpu")
    parallel = ParallelState()
    model = model_provider(gpt_config(config.model, 256, kernels), config.parallel, parallel,
                           tensor_parallel_rng_tracker(config.model.seed, 0))
    engine, _, _ = build_engine(model, config, kernels, parallel)
    batch = make_batch(torch.randint(0, 200, (2, 33)), 200)
    engine.backward(engine(batch["tokens"], **model_inputs(batch)))
    engine.step()
    model_storages = {p.untyped_storage().data_ptr() for p in engine.module.parameters()}
    # Keyed by the tensors Adam stepped (ZeRO-3 puts them into param_groups only during its step).
    stepped, state = zip(*engine.basic_optimizer.state.items())
    facts = {
        "offload": engine.zero_cpu_offload(),
        "optimizer": type(engine.basic_optimizer),
        "stepped_devices": {p.device.type for p in stepped},
        "steps_model_storage": any(p.untyped_storage().data_ptr() in model_storages for p in stepped),
        "state_keys": {key for entry in state for key in entry},
        "state_devices": {entry["exp_avg"].device.type for entry in state},
        "state_moved": all(bool(entry["exp_avg_sq"].abs().sum() > 0) for entry in state),
    }
    engine.destroy()
    return facts


def engines_of_stages(stages) -> dict:
    """offloaded_engine_facts of each stage, one after the other in one process (a launch costs seconds)."""
    return {stage: offloaded_engine_facts(stage) for stage in stages}


def test_engine_offloads_to_torch_adamw_stepping_cpu_master_copies():
    for stage, facts in run_on_ranks(engines_of_stages, 1, ["1", "3"])[0].items():
        assert facts["offload"] is True, stage
        assert facts["optimizer"] is torch.optim.AdamW, stage
        # Adam steps DeepSpeed's fp32 master partitions on the CPU, not the model's own parameters.
        assert facts["stepped_devices"] == {"cpu"} and not facts["steps_model_storage"], stage
        assert facts["state_keys"] >= {"exp_avg", "exp_avg_sq"}, stage
        assert facts["state_devices"] == {"cpu"} and facts["state_moved"], stage


def test_cpu_optimizer_uses_the_cpu_adam_kernel_beside_an_accelerator():
    """The offloaded state is on the CPU, where an accelerator's own Adam kernel (an NPU one, say) cannot step it."""
    from megatron.config.job import OptimizerConfig
    from megatron.model.kernels import PORTABLE_KERNELS

    class AcceleratorAdam(torch.optim.AdamW):
        """Stands in for a device-specific fused kernel."""

    accelerator_kernels = replace(PORTABLE_KERNELS, adam=AcceleratorAdam)
    model = torch.nn.Linear(4, 4)
    config = OptimizerConfig(lr=1e-2, weight_decay=0.01, adam_beta1=0.9, adam_beta2=0.999, adam_eps=1e-8,
                             clip_grad=1.0, cpu_optimizer=False, optimizer="adam", sgd_momentum=0.9)
    on_accelerator = build_optimizer(model, config, accelerator_kernels)
    offloaded = build_optimizer(model, replace(config, cpu_optimizer=True), accelerator_kernels)
    assert type(on_accelerator) is AcceleratorAdam
    assert type(offloaded) is torch.optim.AdamW and offloaded.defaults["fused"] is True  # the CPU's kernel
    assert offloaded.defaults["lr"] == 1e-2 and offloaded.defaults["eps"] == 1e-8
