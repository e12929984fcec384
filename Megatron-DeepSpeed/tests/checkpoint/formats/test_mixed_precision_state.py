"""A dense checkpoint trained at ZeRO stage 0 in bf16 or fp16 converts with its Adam state. DeepSpeed keeps that
state in its mixed-precision wrappers' forms (megatron/checkpoint/formats/mixed_precision_state.py); read per parameter,
the converted checkpoint resumes at ZeRO 1 as the source run goes on, which without the moments it does not, and,
converted with --target-bf16, at ZeRO 0 too (the wrapper's form written back). fp16 does not train on CPU: its
forms are DeepSpeed's own classes' state_dict(), read back exactly, and the converter's --target-fp16 form loads
into DeepSpeed's FP16_UnfusedOptimizer exactly."""
import os
import shutil

import pytest
import torch

from tests.helpers.distributed import run_on_ranks
from tests.helpers.training import COMMON, assert_resumed_with_the_adam_state, train

SAVED_AT = 3
BF16_ZERO0 = ["--bf16", "--zero-stage", "0"]


def run(ranks, data_prefix, *flags):
    return run_on_ranks(train, ranks, [*COMMON, "--data-path", data_prefix, *flags], timeout=600)[0][0]


def converted_for_bf16(source, target, out):
    """`source`'s checkpoint of iteration SAVED_AT converted to `target` for bf16 (--target-bf16) in `out`."""
    from megatron.checkpoint.reshape.conversions import reshape
    reshape(str(source), str(out), target, iteration=SAVED_AT, precision="bf16")
    return out


def assert_resumes_with_the_moments(checkpoint, resume_ranks, straight, data_prefix, resumes, out, *layout):
    """`checkpoint` resumed in bf16 at each ZeRO stage of `resumes`, (stage, rel) pairs (a converted one: ZeRO 1
    from the universal files, ZeRO 0 from its ZeRO-0 form), holds its Adam state bit for bit and takes the source
    run's next steps (to `rel`: bf16 sums in another order at another layout, as in the MoE conversion tests)."""
    for zero_stage, rel in resumes:
        resume = ["--bf16", "--zero-stage", zero_stage, *layout]
        resumed = run(resume_ranks, data_prefix, *resume, "--load", str(checkpoint))
        assert resumed == pytest.approx(straight[SAVED_AT:], rel=rel, abs=0), f"ZeRO {zero_stage}"
        assert_resumed_with_the_adam_state(lambda argv: run_on_ranks(train, resume_ranks, argv, timeout=600),
                                           [*COMMON, "--data-path", data_prefix, *resume], checkpoint, SAVED_AT,
                                           out / f"held_zero{zero_stage}")


@pytest.mark.low_precision
@pytest.mark.full
def test_a_bf16_zero0_plain_engine_checkpoint_resumes_at_zero0_and_zero1_with_its_adam_state(data_prefix, tmp_path):
    # The plain engine wraps our AdamW in FP16_UnfusedOptimizer (torch's state beside the master weights), which
    # the converter writes back for --target-bf16.
    from megatron.checkpoint.torch_files import load_file
    from megatron.checkpoint.reshape.target_writer import TargetLayout
    plain, tp2 = ["--no-pipeline-parallel"], ["--tensor-model-parallel-size", "2"]
    straight = run(2, data_prefix, *BF16_ZERO0, *plain, *tp2, "--save", str(tmp_path / "source"), "--save-interval",
                   str(SAVED_AT))
    saved = load_file(str(tmp_path / "source" / f"global_step{SAVED_AT}" / "mp_rank_01_model_states.pt"))["optimizer"]
    assert {"optimizer_state_dict", "fp32_groups", "cur_scale"} <= saved.keys()
    for target, ranks, rel, layout in ((TargetLayout(2, 1, pipeline_engine=False), 2, 0, tp2),  # bit for bit
                                       (TargetLayout(1, 1, pipeline_engine=False), 1, 1e-4, [])):
        checkpoint = converted_for_bf16(tmp_path / "source", target, tmp_path / f"tp{target.tensor}")
        assert_resumes_with_the_moments(checkpoint, ranks, straight, data_prefix, (("0", rel), ("1", rel)),
                                        checkpoint.parent / f"held_tp{target.tensor}", *plain, *layout)


def only_checkpoint(source, iteration, out):
    """A --load directory holding `source`'s checkpoint of `iteration` alone (its `latest`)."""
    shutil.copytree(source / f"global_step{iteration}", out / f"global_step{iteration}")
    (out / "latest").write_text(f"global_step{iteration}")
    (out / "latest_checkpointed_iteration.txt").write_text(str(iteration))
    return out


@pytest.mark.low_precision
@pytest.mark.full
def test_a_bf16_zero0_pipeline_checkpoint_resumes_at_zero0_and_zero1_with_its_adam_state(data_prefix, tmp_path):
    # The pipeline engine in bf16 steps BF16_Optimizer: each flat group cut over the data-parallel ranks
    # (bf16_zero_pp_rank_* files), here PP 2 x DP 2. DeepSpeed's ZeRO-0 load cannot read them; the trainer does,
    # so the run's own checkpoint resumes bit for bit, and so does one converted for DP 2 at the same layout, whose
    # files equal DeepSpeed's.
    from megatron.checkpoint.torch_files import load_file
    from megatron.checkpoint.reshape.target_writer import TargetLayout
    pp2 = ["--pipeline-model-parallel-size", "2"]
    straight = run(4, data_prefix, *BF16_ZERO0, *pp2, "--save", str(tmp_path / "source"), "--save-interval",
                   str(SAVED_AT))
    step_dir = tmp_path / "source" / f"global_step{SAVED_AT}"
    partition = load_file(str(step_dir / "bf16_zero_pp_rank_1_mp_rank_01_optim_states.pt"))["optimizer_state_dict"]
    assert partition["partition_count"] == [2, 2]
    native = only_checkpoint(tmp_path / "source", SAVED_AT, tmp_path / "native")
    assert run(4, data_prefix, *BF16_ZERO0, *pp2, "--load", str(native)) == straight[SAVED_AT:]
    same = converted_for_bf16(tmp_path / "source", TargetLayout(1, 2, data=2), tmp_path / "same")
    for name in ("bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", "bf16_zero_pp_rank_1_mp_rank_01_optim_states.pt"):
        ours = load_file(str(same / f"global_step{SAVED_AT}" / name))["optimizer_state_dict"]
        deepspeeds = load_file(str(step_dir / name))["optimizer_state_dict"]
        for group, tensors in deepspeeds["base_optimizer_state"]["state"].items():
            for kind, tensor in tensors.items():
                torch.testing.assert_close(ours["base_optimizer_state"]["state"][group][kind], tensor, rtol=0, atol=0)
        for key in ("single_partition_of_fp32_groups", "group_paddings", "partition_count"):
            torch.testing.assert_close(ours[key], deepspeeds[key], rtol=0, atol=0)
    # (ZeRO 1 from the universal files at PP 2: test_reshape.py)
    assert_resumes_with_the_moments(same, 4, straight, data_prefix, (("0", 0),), tmp_path / "held_same", *pp2)
    one = converted_for_bf16(tmp_path / "source", TargetLayout(1, 1, data=1), tmp_path / "one")
    assert_resumes_with_the_moments(one, 1, straight, data_prefix, (("0", 1e-4), ("1", 1e-4)), tmp_path / "held_one")


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


def as_the_engine_saves_it(step_dir, optimizer=None):
    """A checkpoint the writer wrote, made a ZeRO-0 one as the engine saves it: no universal folder or mark, and
    with `optimizer` the mp_rank file's optimizer replaced (else each mp_rank file's kept)."""
    from megatron.checkpoint.torch_files import load_file
    from megatron.checkpoint.file_names import UNIVERSAL_DIR, UNIVERSAL_MARK
    from megatron.checkpoint.torch_files import save
    shutil.rmtree(step_dir / UNIVERSAL_DIR)
    os.remove(step_dir / "manifest.json")  # checked from its layout instead
    for name in os.listdir(step_dir):
        if name.startswith("mp_rank_"):
            model_states = os.path.join(step_dir, name)
            contents = dict(load_file(model_states))  # memory-mapped: written beside it, then moved over it
            del contents[UNIVERSAL_MARK]
            save(model_states + ".new", {**contents, "optimizer": optimizer or contents["optimizer"]})
            os.replace(model_states + ".new", model_states)


def zero0_checkpoint(directory, config, weights, flags, pipeline_engine, optimizer):
    """A ZeRO-0 checkpoint as the engine saves it (no universal folder), its mp_rank file holding `optimizer`."""
    from megatron.checkpoint.formats.reader import read_checkpoint
    from megatron.checkpoint.reshape.target_writer import TargetLayout, TrainingState, write_checkpoint
    write_checkpoint(str(directory), weights, config, TrainingState(2, 16, flags), TargetLayout(1, 1, pipeline_engine))
    as_the_engine_saves_it(directory / "global_step2", optimizer)
    checkpoint = read_checkpoint(str(directory))
    assert checkpoint.layout.zero_stage == 0 and checkpoint.layout.pipeline_engine == pipeline_engine
    return checkpoint


@pytest.mark.parametrize("pipeline_engine", [False, True], ids=["plain", "pipeline"])
@pytest.mark.parametrize("fused", [True, False], ids=["FP16_Optimizer", "FP16_UnfusedOptimizer"])
def test_an_fp16_zero0_adam_state_is_read_per_parameter_as_deepspeed_holds_it(tmp_path, fused, pipeline_engine):
    # A ZeRO-0 fp16 checkpoint's mp_rank file holding DeepSpeed's own wrapper state_dict: every parameter's
    # master weights and moments come back exactly, with AdamW's step and the loss scale. (The pipeline engine at
    # PP 1 holds the parameters in GPTModel's order under its stage names; its module is in the layer files.)
    from megatron.checkpoint.formats.mixed_precision_state import LOSS_SCALE_KEYS
    from megatron.checkpoint.formats.optimizer_state import read_optimizer_state
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
    from megatron.checkpoint.formats.optimizer_state import read_optimizer_state
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


def random_adam_state(weights, loss_scale):
    """An OptimizerState of the full model `weights` with every tensor random (master weights unlike the weights)."""
    from megatron.checkpoint.formats.checkpoint import OptimizerState
    from megatron.config.recorded_flags import RecordedFlags
    generator = torch.Generator().manual_seed(2)
    kinds = {kind: {name: torch.rand(tensor.shape, generator=generator) for name, tensor in weights.items()}
             for kind in ("fp32", "exp_avg", "exp_avg_sq")}
    return OptimizerState(step=3, param_groups=RecordedFlags.of({"lr": 1e-2}).adam_param_groups, loss_scale=loss_scale,
                          **kinds)


def load_into_fp16_unfused_optimizer(config, weights, saved):
    """DeepSpeed's FP16_UnfusedOptimizer (the plain engine's wrapper of our AdamW at ZeRO 0 in fp16) over a
    half-precision GPT model in our groups, loading `saved` with its own load_state_dict: per parameter name its
    master weights and moments, and its loss scale."""
    import deepspeed
    from deepspeed.runtime.fp16.loss_scaler import LossScaleConfig, LossScaleProfile
    from deepspeed.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer

    from megatron.checkpoint.formats.mixed_precision_state import LOSS_SCALE_KEYS
    from megatron.model.gpt import GPTModel
    from megatron.training.optimizer import parameter_groups
    deepspeed.init_distributed("gloo", verbose=False)
    model = GPTModel(config)
    model.load_state_dict(weights)
    model.half()
    scale = LossScaleConfig(torch.float16, True, 1.0, None, profile=LossScaleProfile.UNFUSED)
    optimizer = FP16_UnfusedOptimizer(torch.optim.AdamW(parameter_groups(model, 0.01), lr=1e-2),
                                      loss_scale_config=scale, low_precision_dtype=torch.float16)
    optimizer.load_state_dict(saved)
    names = {parameter: name for name, parameter in model.named_parameters()}
    loaded = {}
    for halves, masters in zip(optimizer.fp16_groups, optimizer.fp32_groups):
        for half, master in zip(halves, masters):
            loaded[names[half]] = {"fp32": master.detach().clone(),
                                   **{kind: optimizer.optimizer.state[master][kind] for kind in ("exp_avg",
                                                                                                 "exp_avg_sq")}}
    return loaded, {key: getattr(optimizer.loss_scale_config, key) for key in LOSS_SCALE_KEYS}


def test_a_converted_fp16_target_loads_into_deepspeeds_fp16_unfused_optimizer_exactly(tmp_path):
    # --target-fp16 for the plain engine: the mp_rank file's 'optimizer' is FP16_UnfusedOptimizer's form, which
    # DeepSpeed's own loader takes: every parameter's master weights and moments as converted, an fp16 source's
    # dynamic loss scale continued; the client state records the precision plan_resume checks.
    from megatron.checkpoint.torch_files import load_file
    from megatron.checkpoint.formats.mixed_precision_state import target_loss_scale
    from megatron.checkpoint.reshape.target_writer import TargetLayout, TrainingState, write_checkpoint
    config, weights, flags = fp16_model(pipeline_engine=False)
    source_scale = {"dynamic_loss_scale": True, "cur_scale": 512.0, "cur_iter": 2, "last_overflow_iter": 1,
                    "scale_factor": 2.0, "scale_window": 10}
    state = random_adam_state(weights, source_scale)
    write_checkpoint(str(tmp_path), weights, config, TrainingState(2, 16, flags), TargetLayout(1, 1, False), state,
                     precision="fp16")
    contents = load_file(str(tmp_path / "global_step2" / "mp_rank_00_model_states.pt"))
    assert contents["optimizer_precision"] == "fp16"
    loaded, scale = run_on_ranks(load_into_fp16_unfused_optimizer, 1, config, weights, contents["optimizer"])[0]
    assert loaded.keys() == weights.keys()
    for name, kinds in loaded.items():
        for kind, tensor in kinds.items():
            torch.testing.assert_close(tensor, state.tensors(kind)[name], rtol=0, atol=0, msg=f"{kind} {name}")
    assert scale == source_scale == target_loss_scale("fp16", flags, 2, source_scale, "fp16")


def test_a_converted_fp16_pipeline_target_reads_back_per_parameter(tmp_path):
    # The pipeline engine wraps our AdamW in FP16_UnfusedOptimizer in fp16 too, over its stage's parameters in
    # its module order (the tied embedding first): at TP 2 x PP 2 the mp_rank files, read as the engine's own
    # ZeRO-0 save (zero/ removed), give back every tensor and the loss scale.
    from megatron.checkpoint.formats.optimizer_state import read_optimizer_state
    from megatron.checkpoint.formats.reader import read_checkpoint
    from megatron.checkpoint.reshape.target_writer import TargetLayout, TrainingState, write_checkpoint
    config, weights, flags = fp16_model(pipeline_engine=True)
    state = random_adam_state(weights, None)
    write_checkpoint(str(tmp_path), weights, config, TrainingState(2, 16, flags), TargetLayout(2, 2), state,
                     precision="fp16")
    as_the_engine_saves_it(tmp_path / "global_step2")
    read = read_optimizer_state(read_checkpoint(str(tmp_path)))
    assert read.step == state.step
    for kind in ("fp32", "exp_avg", "exp_avg_sq"):
        for name in weights:
            torch.testing.assert_close(read.tensors(kind)[name], state.tensors(kind)[name], rtol=0, atol=0,
                                       msg=f"{kind} {name}")
    assert read.loss_scale == {"dynamic_loss_scale": True, "cur_scale": 2.0 ** 32, "cur_iter": 2,
                               "last_overflow_iter": -1, "scale_factor": 2.0, "scale_window": 1000}


def test_a_converted_dense_checkpoints_zero0_state_resumes_only_in_its_precision_and_says_how_else():
    # What plan_resume checks before any engine exists: the precision the converter wrote the ZeRO-0 form for
    # (fp32 when none is recorded, as earlier converters wrote) and, for BF16_Optimizer's slices, their DP size.
    from megatron.checkpoint.formats.detect import Layout
    from megatron.checkpoint.trainer.resume_plan import check_zero0_precision
    from megatron.errors import InputError

    def run(data=2, pipeline_engine=False):
        return Layout(tensor=1, pipeline=1, data=data, zero_stage=0, pipeline_engine=pipeline_engine)
    bf16_slices_for_dp2 = {"optimizer_precision": "bf16", "optimizer_data_parallel_size": 2}
    check_zero0_precision("ckpt", {}, run(), "fp32")
    check_zero0_precision("ckpt", {"optimizer_precision": "fp16"}, run(data=8, pipeline_engine=True), "fp16")
    check_zero0_precision("ckpt", bf16_slices_for_dp2, run(pipeline_engine=True), "bf16")
    for state, layout, precision, message in (
            ({}, run(), "fp16", "converted for fp32 training and this run trains in fp16; resume it with neither "
                                "--fp16 nor --bf16, convert it again with tools/convert_checkpoint.py --target-fp16, "
                                "or pass --no-load-optim (or resume it at --zero-stage 1 or higher"),
            ({"optimizer_precision": "fp16"}, run(data=4, pipeline_engine=True), "bf16",
             "resume it with --fp16, convert it again with tools/convert_checkpoint.py --target-bf16 "
             "--target-data-parallel-size 4, or pass --no-load-optim"),
            (bf16_slices_for_dp2, run(data=4, pipeline_engine=True), "bf16",
             "BF16_Optimizer's slices for data-parallel size 2, and this run's is 4; resume it at that size, convert "
             "it again with tools/convert_checkpoint.py --target-bf16 --target-data-parallel-size 4")):
        with pytest.raises(InputError) as caught:
            check_zero0_precision("ckpt", state, layout, precision)
        assert message in str(caught.value) and "\n" not in str(caught.value)


def test_the_converters_dense_target_flags_that_do_not_fit_are_refused_in_one_line():
    from megatron.checkpoint.reshape.conversions import check_dense_target
    from megatron.checkpoint.reshape.target_writer import TargetLayout
    from megatron.errors import InputError
    check_dense_target("ckpt", TargetLayout(2, 2, data=4), "bf16")
    check_dense_target("ckpt", TargetLayout(1, 2), "fp16")
    check_dense_target("ckpt", TargetLayout(2, 1, pipeline_engine=False), "bf16")
    check_dense_target("ckpt", TargetLayout(1, 2), "bf16", with_adam=False)  # weights only: no slices to cut
    for target, precision, message in (
            (TargetLayout(1, 2), "bf16", "add --target-data-parallel-size D, the resumed run's world size / (TP 1 x "
                                         "PP 2)"),
            (TargetLayout(1, 1, pipeline_engine=False, data=2), "bf16", "only for the pipeline engine in bf16"),
            (TargetLayout(1, 2, data=2), "fp16", "only for the pipeline engine in bf16")):
        with pytest.raises(InputError) as caught:
            check_dense_target("ckpt", target, precision)
        assert message in str(caught.value) and "\n" not in str(caught.value)
