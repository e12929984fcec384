"""A dense checkpoint trained at ZeRO stage 0 in bf16 or fp16 converts with its Adam state. DeepSpeed keeps that
state in its mixed-precision wrappers' forms (megatron/checkpoint/mixed_precision_state.py); read per parameter,
the converted checkpoint resumes at ZeRO 1 as the source run goes on, which without the moments it does not.
fp16 does not train on CPU: its forms are DeepSpeed's own classes' state_dict(), read back exactly."""
import os
import shutil

import pytest
import torch

from tests.distributed_helpers import run_on_ranks
from tests.training_helpers import COMMON, train

SAVED_AT = 3
BF16_ZERO0 = ["--bf16", "--zero-stage", "0"]


def run(ranks, data_prefix, *flags):
    return run_on_ranks(train, ranks, [*COMMON, "--data-path", data_prefix, *flags], timeout=600)[0][0]


def assert_resumes_with_the_moments(source, target, resume_ranks, straight, data_prefix, tmp_path, rel, *layout):
    """The conversion of `source` to `target` resumed at ZeRO 1 in bf16 takes the source run's next steps (to
    `rel`: bf16 sums in another order at another layout, as in the MoE conversion tests); resumed without the
    moments its second step is off by over 100 times as much."""
    from megatron.checkpoint.convert import reshape
    reshape(str(source), str(tmp_path / "converted"), target, iteration=SAVED_AT)
    resume = ["--bf16", "--zero-stage", "1", *layout, "--load", str(tmp_path / "converted")]
    resumed = run(resume_ranks, data_prefix, *resume)
    fresh_moments = run(resume_ranks, data_prefix, *resume, "--no-load-optim")
    assert resumed == pytest.approx(straight[SAVED_AT:], rel=rel, abs=0)
    assert abs(fresh_moments[1] - straight[SAVED_AT + 1]) > 100 * abs(resumed[1] - straight[SAVED_AT + 1])
    shutil.rmtree(tmp_path / "converted")


@pytest.mark.full
def test_a_bf16_zero0_plain_engine_checkpoint_resumes_at_zero1_with_its_adam_state(data_prefix, tmp_path):
    # The plain engine wraps our AdamW in FP16_UnfusedOptimizer (torch's state beside the master weights).
    from megatron.checkpoint.directory import load_file
    plain, tp2 = ["--no-pipeline-parallel"], ["--tensor-model-parallel-size", "2"]
    straight = run(2, data_prefix, *BF16_ZERO0, *plain, *tp2, "--save", str(tmp_path / "source"), "--save-interval",
                   str(SAVED_AT))
    saved = load_file(str(tmp_path / "source" / f"global_step{SAVED_AT}" / "mp_rank_01_model_states.pt"))["optimizer"]
    assert {"optimizer_state_dict", "fp32_groups", "cur_scale"} <= saved.keys()
    from megatron.checkpoint.writer import TargetLayout
    for target, ranks, rel, layout in ((TargetLayout(2, 1, pipeline_engine=False), 2, 0, tp2),  # bit for bit
                                       (TargetLayout(1, 1, pipeline_engine=False), 1, 1e-4, [])):
        assert_resumes_with_the_moments(tmp_path / "source", target, ranks, straight, data_prefix, tmp_path, rel,
                                        *plain, *layout)


@pytest.mark.full
def test_a_bf16_zero0_pipeline_checkpoint_resumes_at_zero1_with_its_adam_state(data_prefix, tmp_path):
    # The pipeline engine in bf16 steps BF16_Optimizer: each flat group cut over the data-parallel ranks
    # (bf16_zero_pp_rank_* files), here PP 2 x DP 2.
    from megatron.checkpoint.directory import load_file
    from megatron.checkpoint.writer import TargetLayout
    pp2 = ["--pipeline-model-parallel-size", "2"]
    straight = run(4, data_prefix, *BF16_ZERO0, *pp2, "--save", str(tmp_path / "source"), "--save-interval",
                   str(SAVED_AT))
    step_dir = tmp_path / "source" / f"global_step{SAVED_AT}"
    partition = load_file(str(step_dir / "bf16_zero_pp_rank_1_mp_rank_01_optim_states.pt"))["optimizer_state_dict"]
    assert partition["partition_count"] == [2, 2]
    for target, ranks, layout in ((TargetLayout(1, 2), 2, pp2), (TargetLayout(1, 1), 1, [])):  # resumed at DP 1
        assert_resumes_with_the_moments(tmp_path / "source", target, ranks, straight, data_prefix, tmp_path, 1e-4,
                                        *layout)


def deepspeeds_fp16_state(fused, config, weights):
    """DeepSpeed's fp16 wrapper over a half-precision copy of a dense GPT model in our AdamW groups:
    FP16_Optimizer (`fused`, as upstream's FusedAdam gets it: flat groups) or FP16_UnfusedOptimizer (torch's
    AdamW, ours), master weights and moments filled at random. Its state_dict() and per parameter name the
    tensors DeepSpeed holds for it (the flat ones cut by torch's _unflatten_dense_tensors, as DeepSpeed does)."""
    import deepspeed
    from deepspeed.runtime.fp16.fused_optimizer import FP16_Optimizer
    from deepspeed.runtime.fp16.loss_scaler import LossScaleConfig, LossScaleProfile
    from deepspeed.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer
    from torch._utils import _unflatten_dense_tensors

    from megatron.model.gpt import GPTModel
    from megatron.training.optimizer import parameter_groups
    deepspeed.init_distributed("gloo", verbose=False)
    model = GPTModel(config)
    model.load_state_dict(weights)
    model.half()
    adam = torch.optim.AdamW(parameter_groups(model, 0.01), lr=1e-2)
    if fused:
        optimizer = FP16_Optimizer(adam, loss_scale_config=LossScaleConfig(torch.float16, True, 1.0, None))
        masters, halves = optimizer.fp32_groups_flat, optimizer.fp16_groups
    else:
        scale = LossScaleConfig(torch.float16, True, 1.0, None, profile=LossScaleProfile.UNFUSED)
        optimizer = FP16_UnfusedOptimizer(adam, loss_scale_config=scale, low_precision_dtype=torch.float16)
        masters, halves = [p for group in optimizer.fp32_groups for p in group], [[p] for group in
                                                                                 optimizer.fp16_groups for p in group]
    generator = torch.Generator().manual_seed(1)
    names = {parameter: name for name, parameter in model.named_parameters()}
    expected = {}
    for master, parameters in zip(masters, halves):
        if master not in optimizer.optimizer.state:  # FP16_Optimizer's constructor steps nothing
            optimizer.optimizer.state[master] = {"step": torch.tensor(3.0), "exp_avg": torch.zeros_like(master),
                                                 "exp_avg_sq": torch.zeros_like(master)}
        tensors = {"fp32": master.data, **optimizer.optimizer.state[master]}
        for kind in ("fp32", "exp_avg", "exp_avg_sq"):
            tensors[kind].copy_(torch.rand(master.shape, generator=generator))
            for parameter, piece in zip(parameters, _unflatten_dense_tensors(tensors[kind].flatten(), parameters)):
                expected.setdefault(names[parameter], {})[kind] = piece.clone()
    return optimizer.state_dict(), expected


def fp16_model(pipeline_engine):
    """The GPT config, its fresh weights and the flags of an fp16 ZeRO-0 run (an accelerator's: fp16 does not
    train on CPU)."""
    from megatron.config.arguments import job_config, parse_args, validate_args
    from megatron.model.gpt import GPTModel
    from megatron.model.gpt_config import gpt_config
    engine = [] if pipeline_engine else ["--no-pipeline-parallel"]
    flags = job_config(validate_args(parse_args([*COMMON, "--mock-data", "--fp16", "--zero-stage", "0", *engine]), 1,
                                     "cuda"))
    config = gpt_config(flags.model, 256)
    return config, GPTModel(config).state_dict(), flags.flags


def zero0_checkpoint(directory, config, weights, flags, pipeline_engine, optimizer):
    """A ZeRO-0 checkpoint as the engine saves it (no universal folder), its mp_rank file holding `optimizer`."""
    from megatron.checkpoint.directory import load_file
    from megatron.checkpoint.layout import UNIVERSAL_DIR, UNIVERSAL_MARK, model_states_file
    from megatron.checkpoint.reader import read_checkpoint
    from megatron.checkpoint.saving import save
    from megatron.checkpoint.writer import TargetLayout, TrainingState, write_checkpoint
    write_checkpoint(str(directory), weights, config, TrainingState(2, 16, flags), TargetLayout(1, 1, pipeline_engine))
    step_dir = directory / "global_step2"
    shutil.rmtree(step_dir / UNIVERSAL_DIR)
    os.remove(step_dir / "manifest.json")  # checked from its layout instead
    model_states = os.path.join(step_dir, model_states_file(0, 0))
    contents = dict(load_file(model_states))  # memory-mapped: written beside it, then moved over it
    del contents[UNIVERSAL_MARK]
    save(model_states + ".new", {**contents, "optimizer": optimizer})
    os.replace(model_states + ".new", model_states)
    checkpoint = read_checkpoint(str(directory))
    assert checkpoint.layout.zero_stage == 0 and checkpoint.layout.pipeline_engine == pipeline_engine
    return checkpoint


@pytest.mark.parametrize("pipeline_engine", [False, True], ids=["plain", "pipeline"])
@pytest.mark.parametrize("fused", [True, False], ids=["FP16_Optimizer", "FP16_UnfusedOptimizer"])
def test_an_fp16_zero0_adam_state_is_read_per_parameter_as_deepspeed_holds_it(tmp_path, fused, pipeline_engine):
    # A ZeRO-0 fp16 checkpoint's mp_rank file holding DeepSpeed's own wrapper state_dict: every parameter's
    # master weights and moments come back exactly, with AdamW's step and the loss scale. (The pipeline engine at
    # PP 1 holds the parameters in GPTModel's order under its stage names; its module is in the layer files.)
    from megatron.checkpoint.mixed_precision_state import LOSS_SCALE_KEYS
    from megatron.checkpoint.optimizer_state import read_optimizer_state
    config, weights, flags = fp16_model(pipeline_engine)
    saved, expected = run_on_ranks(deepspeeds_fp16_state, 1, fused, config, weights)[0]
    state = read_optimizer_state(zero0_checkpoint(tmp_path, config, weights, flags, pipeline_engine, saved))
    assert expected.keys() == weights.keys()
    for name, kinds in expected.items():
        for kind, tensor in kinds.items():
            torch.testing.assert_close(state.tensors(kind)[name], tensor, rtol=0, atol=0, msg=f"{kind} {name}")
    assert state.step == int(saved["optimizer_state_dict"]["state"][0]["step"])
    assert state.loss_scale == {key: saved[key] for key in LOSS_SCALE_KEYS}


def test_a_wrapper_state_of_another_model_is_refused_in_one_line(tmp_path):
    # FP16_UnfusedOptimizer's state of one parameter fewer than the model has: named, with the way out.
    from megatron.checkpoint.optimizer_state import read_optimizer_state
    from megatron.errors import InputError
    config, weights, flags = fp16_model(pipeline_engine=False)
    matrices = [tensor.float() for tensor in weights.values() if tensor.dim() > 1][1:]
    adam = {index: {"step": torch.tensor(3.0), "exp_avg": tensor, "exp_avg_sq": tensor}
            for index, tensor in enumerate(matrices)}
    saved = {"dynamic_loss_scale": False, "cur_scale": 1.0, "cur_iter": 2, "fp32_groups": [matrices],
             "optimizer_state_dict": {"state": adam, "param_groups": [{"params": list(range(len(matrices)))}]}}
    checkpoint = zero0_checkpoint(tmp_path, config, weights, flags, False, saved)
    with pytest.raises(InputError, match=r"mp_rank_00_model_states.pt holds the optimizer state of another model "
                                         r"than its weights \(\d+ parameters on model-parallel rank 0\); convert it "
                                         "with --weights-only"):
        read_optimizer_state(checkpoint)
