"""Mixture-of-experts checkpoints for upstream's trainer and through conversion: the converter's expert files load
through DeepSpeed's own loader into upstream's module tree, and an MoE checkpoint's Adam state (DeepSpeed's ZeRO-0
per-expert-parallel-rank files in fp32, fp16 and bf16, and its ZeRO 1-2 partitions) converted for another
expert-parallel size resumes as the source run goes on. Real processes over gloo where a run is trained."""
import os

import pytest
import torch
from tests.helpers.distributed import run_on_ranks
from tests.helpers.moe import COMMON, skewed_model, train_moe, validated
from tests.helpers.training import assert_resumed_with_the_adam_state

from megatron.model.moe import is_expert_parameter


def load_experts_as_upstream(directory, expert_parallel_size):
    """Upstream's trainer loading a checkpoint's experts on this rank: DeepSpeed's own load_moe_state_dict (the
    call its engine makes) into a module whose MoE layers sit where upstream's GPTModel holds them
    (language_model.encoder.layers[N].mlp), our DeepSpeed MoE layers at the checkpoint's shape. Returns the state
    dict DeepSpeed filled, the module's expert parameter names, and the module's experts after torch's
    load_state_dict of that state (unexpected keys refused)."""
    import dataclasses

    import deepspeed
    from deepspeed.runtime.engine import DeepSpeedEngine

    from megatron.checkpoint.formats.reader import read_checkpoint
    from megatron.checkpoint.trust import deepspeed_loads
    from megatron.model.gpt_config import gpt_config
    from megatron.model.moe import MoEGPTModel, expert_parallel_rank

    deepspeed.init_distributed("gloo", verbose=False)  # DeepSpeed's view of the joined group
    checkpoint = read_checkpoint(directory)
    moe = dataclasses.replace(checkpoint.moe, expert_parallel_size=expert_parallel_size)
    model = MoEGPTModel(gpt_config(checkpoint.model_config, checkpoint.padded_vocab_size, moe=moe),
                        expert_parallel_rank(moe, None))
    upstream = torch.nn.Module()
    upstream.language_model = torch.nn.Module()
    upstream.language_model.encoder = torch.nn.Module()
    upstream.language_model.encoder.layers = model.layers
    for parameter in upstream.parameters():  # nothing the loader leaves out can pass for a loaded weight
        torch.nn.init.constant_(parameter, float("nan"))
    state = {}
    with deepspeed_loads():
        DeepSpeedEngine.load_moe_state_dict(os.path.dirname(checkpoint.directory),
                                            os.path.basename(checkpoint.directory), state, old_moe_load=False,
                                            model=upstream, num_experts=list(checkpoint.moe.num_experts))
    names = [name for name, _ in upstream.named_parameters() if is_expert_parameter(name)]
    assert upstream.load_state_dict(state, strict=False).unexpected_keys == []
    return state, names, {name: p.detach().clone() for name, p in upstream.named_parameters() if name in names}


def assert_loaded_as_upstream(loaded, source, expert_parallel_size):
    """Each rank of load_experts_as_upstream holds its consecutive share of the source's experts (global index)
    under upstream's module path, with the local index DeepSpeed gives them."""
    from megatron.checkpoint.formats.expert_optimizer_state import expert_counts, global_name
    from megatron.checkpoint.parameter_names import expert_model_name
    counts = expert_counts(source)
    for rank, (state, names, experts) in enumerate(loaded):
        assert sorted(state) == sorted(names) and names
        assert all(name.startswith("language_model.encoder.layers.") for name in names)
        for name, tensor in experts.items():
            whole = global_name(expert_model_name(name), rank, expert_parallel_size, counts)
            torch.testing.assert_close(tensor, source[whole], rtol=0, atol=0, msg=name)


def test_the_converters_expert_files_load_through_deepspeeds_loader_into_upstreams_module_tree(tmp_path):
    # DeepSpeed names each expert-file key by the MoE layer's module path (deepspeed/runtime/engine.py,
    # _save_moe_checkpoint): `layers.N.mlp...` in our GPTModel, `language_model.encoder.layers.N.mlp...` in
    # upstream's (megatron/model/transformer.py, language_model.py at b4d4a0e), whose trainer loads only its own.
    # The converter's writer uses upstream's, which DeepSpeed's loader then hands to upstream's modules unchanged.
    from megatron.checkpoint.reshape.target_writer import TargetLayout, TrainingState, write_checkpoint
    from megatron.config.arguments import job_config
    from megatron.model.gpt_config import gpt_config
    from megatron.model.moe import MoEGPTModel
    config = job_config(validated("--num-experts", "4", "--no-pipeline-parallel", "--num-layers", "2",
                                  world_size=1))
    gpt = gpt_config(config.model, 256, moe=config.moe)
    source = MoEGPTModel(gpt).state_dict()
    write_checkpoint(str(tmp_path), source, gpt, TrainingState(2, 8, config.flags),
                     TargetLayout(1, 1, pipeline_engine=False))
    assert_loaded_as_upstream(run_on_ranks(load_experts_as_upstream, 1, str(tmp_path), 1), source, 1)


@pytest.mark.full
def test_a_converted_checkpoint_loads_its_experts_as_upstreams_trainer_does_and_resumes_here(data_prefix, tmp_path):
    # The trainer writes its own module path; converted, the same checkpoint carries upstream's: it reads as the
    # same model, DeepSpeed's loader at EP 2 puts every expert where upstream's module tree holds it, and this
    # trainer resumes from it exactly (DeepSpeed's loader, then our module's load, which maps upstream's names).
    from megatron.checkpoint.torch_files import load_file
    from megatron.checkpoint.formats.reader import read_checkpoint
    from tools.convert_checkpoint import main as convert_main
    flags = [*COMMON, "--data-path", data_prefix]
    straight = run_on_ranks(train_moe, 1, [*flags, "--save", str(tmp_path / "ours"), "--save-interval", "2"])[0]
    convert_main(["--load", str(tmp_path / "ours"), "--iteration", "2", "--save", str(tmp_path / "upstream"),
                  "--target-no-pipeline-parallel"])
    for name in ("ours", "upstream"):
        keys = {key for path in (tmp_path / name / "global_step2").glob("layer_*_expert_*_model_states.pt")
                for key in load_file(str(path))}
        assert keys and all(key.startswith("language_model.encoder.layers.") == (name == "upstream") for key in keys)
    ours, upstream = (read_checkpoint(str(tmp_path / name), iteration=2).model for name in ("ours", "upstream"))
    assert upstream.keys() == ours.keys()
    for name, tensor in ours.items():
        torch.testing.assert_close(upstream[name], tensor, rtol=0, atol=0, msg=name)
    assert_loaded_as_upstream(run_on_ranks(load_experts_as_upstream, 2, str(tmp_path / "upstream"), 2), ours, 2)
    resumed = run_on_ranks(train_moe, 1, [*flags, "--load", str(tmp_path / "upstream")])[0]
    assert resumed[0] == straight[0][2:]


@pytest.mark.full
def test_an_ep2_checkpoint_reshaped_with_its_adam_state_resumes_at_ep1_and_ep4_as_the_source_run(data_prefix, tmp_path):
    # EP 2 x DP 2 saves at iteration 2, once at ZeRO 0 (DeepSpeed's expp_rank files: each expert-parallel rank's
    # AdamW state_dict) and once at ZeRO 2 (flat partitions: the dense state over all four ranks, each
    # expert-parallel rank's experts' over the two ranks holding them). Reshaped with the Adam state, regrouped
    # per target expert-parallel rank, both take the source run's iterations 3 and 4 in one process, and the
    # ZeRO 0 one also at EP 4 x DP 4. The ZeRO 2 run names --create-moe-param-group, as upstream's scripts do, so
    # its target's files carry DeepSpeed's MoE groups; the ZeRO 0 one has our two groups.
    from megatron.checkpoint.reshape.conversions import reshape
    from megatron.checkpoint.formats.optimizer_state import read_optimizer_state
    from megatron.checkpoint.formats.reader import read_checkpoint
    from megatron.checkpoint.reshape.target_writer import TargetLayout
    from megatron.errors import InputError
    flags = [*COMMON, "--data-path", data_prefix, "--moe-expert-parallel-size"]
    groups = {"0": [], "2": ["--create-moe-param-group"]}
    straight = {stage: run_on_ranks(train_moe, 4, [*flags, "2", "--zero-stage", stage, *groups[stage], "--save",
                                                   str(tmp_path / f"zero{stage}"), "--save-interval", "2"])[0]
                for stage in ("0", "2")}
    # Both layouts hold the same state under the single-process names; ZeRO 2's master weights, placed by the
    # expert-parallel rule, are the experts DeepSpeed filed by global index.
    zero0, zero2 = (read_checkpoint(str(tmp_path / f"zero{stage}"), iteration=2) for stage in ("0", "2"))
    adam0, adam2 = read_optimizer_state(zero0), read_optimizer_state(zero2)
    for name, weight in zero2.model.items():
        torch.testing.assert_close(adam2.fp32[name], weight, rtol=0, atol=0, msg=name)
        for kind in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(adam2.tensors(kind)[name], adam0.tensors(kind)[name], rtol=1e-4, atol=1e-9,
                                       msg=name)
    with pytest.raises(InputError, match="--target-expert-parallel-size 3 does not divide the --num-experts 4"):
        reshape(str(tmp_path / "zero0"), str(tmp_path / "ep3"), TargetLayout(1, 1, pipeline_engine=False, expert=3),
                iteration=2, weights_only=True)
    for stage in ("0", "2"):
        reshape(str(tmp_path / f"zero{stage}"), str(tmp_path / f"ep1_zero{stage}"),
                TargetLayout(1, 1, pipeline_engine=False), iteration=2)
    from tools.convert_checkpoint import main as convert_main
    convert_main(["--load", str(tmp_path / "zero0"), "--iteration", "2", "--save", str(tmp_path / "ep4_zero0"),
                  "--target-no-pipeline-parallel", "--target-expert-parallel-size", "4"])
    # A TP 2 x EP 2 target (not trainable with experts over gloo) holds the same model: the dense part split, every
    # expert file per tensor-parallel rank; each rank's expp_rank file its shards of the dense moments.
    reshape(str(tmp_path / "zero0"), str(tmp_path / "tp2"), TargetLayout(2, 1, pipeline_engine=False, expert=2),
            iteration=2)
    split = read_checkpoint(str(tmp_path / "tp2")).model
    assert split.keys() == zero0.model.keys()
    for name, tensor in zero0.model.items():
        torch.testing.assert_close(split[name], tensor, rtol=0, atol=0, msg=name)
    from megatron.checkpoint.formats.expert_optimizer_state import module_order, rank_names, state_order
    from megatron.checkpoint.torch_files import load_file
    names = rank_names(module_order(list(zero0.model)), 1, 2)
    order = state_order(names, lambda name: zero0.model[name].dim() > 1, expert_groups=False)
    qkv = "layers.0.self_attention.query_key_value.weight"  # column-parallel: rows split
    for tp in range(2):
        written = load_file(str(tmp_path / "tp2" / "global_step2" / f"expp_rank_1_mp_rank_{tp:02d}_optim_states.pt"))
        state = written["optimizer"]["state"]
        torch.testing.assert_close(state[order.index(qkv)]["exp_avg"], adam0.exp_avg[qkv].chunk(2)[tp], rtol=0,
                                   atol=0)
        expert = "layers.1.mlp.deepspeed_moe.experts.deepspeed_experts.3.dense_h_to_4h.weight"  # whole
        torch.testing.assert_close(state[order.index(expert)]["exp_avg_sq"], adam0.exp_avg_sq[expert], rtol=0,
                                   atol=0)
    for expert_parallel, stage in ((1, "0"), (4, "0"), (1, "2")):
        resumed = run_on_ranks(train_moe, expert_parallel, [*flags, str(expert_parallel), *groups[stage], "--load",
                                                            str(tmp_path / f"ep{expert_parallel}_zero{stage}")])[0]
        assert resumed[0] == pytest.approx(straight[stage][0][2:], rel=1e-5), (expert_parallel, stage)
    # DeepSpeed reads those per-rank files at ZeRO 0 only.
    with pytest.raises(AssertionError, match="resume it with --zero-stage 0, or pass --no-load-optim"):
        run_on_ranks(train_moe, 1, [*flags, "1", "--load", str(tmp_path / "ep1_zero0"), "--zero-stage", "1"])


@pytest.mark.low_precision
@pytest.mark.full
def test_a_bf16_ep2_checkpoint_converted_with_its_adam_state_resumes_in_bf16_at_ep2_and_ep1(data_prefix, tmp_path):
    # bf16 at ZeRO 0: DeepSpeed wraps our AdamW in its FP16_UnfusedOptimizer (fp32 master weights, loss scale),
    # the form fp16 at ZeRO 0 (upstream's MoE scripts) saves too. EP 2 x DP 2 saves at iteration 2; converted
    # with its Adam state at the same layout and to EP 1, the resumed runs take the source run's iterations 3
    # and 4 (at EP 2 bit for bit); resumed at EP 1, it holds the converted Adam state bit for bit.
    from megatron.checkpoint.torch_files import load_file
    from tools.convert_checkpoint import main as convert_main
    flags = [*COMMON, "--data-path", data_prefix, "--bf16", "--moe-expert-parallel-size"]
    straight = run_on_ranks(train_moe, 4, [*flags, "2", "--save", str(tmp_path / "source"), "--save-interval", "2"])[0]
    for expert_parallel in (1, 2):
        convert_main(["--load", str(tmp_path / "source"), "--iteration", "2", "--save",
                      str(tmp_path / f"ep{expert_parallel}"), "--target-no-pipeline-parallel",
                      "--target-expert-parallel-size", str(expert_parallel)])
    written = load_file(str(tmp_path / "ep1" / "global_step2" / "expp_rank_0_mp_rank_00_optim_states.pt"))["optimizer"]
    assert (written["dynamic_loss_scale"], written["cur_scale"], written["cur_iter"]) == (False, 1.0, 2)
    same_layout = run_on_ranks(train_moe, 4, [*flags, "2", "--load", str(tmp_path / "ep2")])[0]
    assert same_layout[0] == straight[0][2:] and same_layout[2] == straight[2]
    one_process = run_on_ranks(train_moe, 1, [*flags, "1", "--load", str(tmp_path / "ep1")])[0][0]
    assert one_process == pytest.approx(straight[0][2:], rel=1e-4)  # bf16 sums in another order at EP 1
    assert_resumed_with_the_adam_state(lambda argv: run_on_ranks(train_moe, 1, argv), [*flags, "1"], tmp_path / "ep1",
                                       2, tmp_path / "held")
    # The state is in bf16's form: an fp32 run is refused, and named the way out.
    with pytest.raises(AssertionError, match="converted for bf16 training and this run trains in fp32; resume it "
                                             "with --bf16, convert it again with tools/convert_checkpoint.py "
                                             "--target-fp32, or pass --no-load-optim"):
        run_on_ranks(train_moe, 1, [*COMMON, "--data-path", data_prefix, "--load", str(tmp_path / "ep1")])


@pytest.mark.low_precision
@pytest.mark.full
def test_a_bf16_zero1_checkpoint_converted_for_a_data_parallel_size_resumes_at_zero1_as_the_source_run(data_prefix,
                                                                                                     tmp_path):
    # This project's default, bf16 at ZeRO 1, PR-MoE at EP 2 x DP 4: DeepSpeed's ZeRO partitions, its dense
    # vectors' group padded (898 elements over 8). Converted with --target-data-parallel-size at the same layout,
    # the files are DeepSpeed's own, bit for bit, and the run resumes exactly; converted to EP 1 x DP 1, one
    # process takes the source run's iterations 3 and 4 and holds the converted Adam state bit for bit. Another
    # data-parallel size is refused in one line.
    from megatron.checkpoint.torch_files import load_file
    from megatron.checkpoint.file_names import optimizer_states_file
    from tools.convert_checkpoint import main as convert_main
    flags = [*COMMON, "--data-path", data_prefix, "--bf16", "--zero-stage", "1", "--mlp-type", "residual",
             "--moe-expert-parallel-size"]
    straight = run_on_ranks(train_moe, 4, [*flags, "2", "--save", str(tmp_path / "source"), "--save-interval", "2"])[0]
    for expert_parallel, data_parallel in ((2, 4), (1, 1)):
        convert_main(["--load", str(tmp_path / "source"), "--iteration", "2", "--save",
                      str(tmp_path / f"ep{expert_parallel}"), "--target-no-pipeline-parallel",
                      "--target-expert-parallel-size", str(expert_parallel),
                      "--target-data-parallel-size", str(data_parallel)])
    for rank in range(4):
        saved, written = (load_file(str(tmp_path / name / "global_step2" / optimizer_states_file(0, rank, bf16=True)))
                          ["optimizer_state_dict"] for name in ("source", "ep2"))
        assert saved["group_paddings"][1] == (6 if rank == 3 else 0)
        for key, value in written.items():
            if key == "base_optimizer_state":
                assert value["param_groups"] == saved[key]["param_groups"]
                for group, state in saved[key]["state"].items():
                    assert all(torch.equal(value["state"][group][kind], state[kind]) for kind in state), (rank, group)
            elif key == "single_partition_of_fp32_groups":
                assert all(torch.equal(mine, theirs) for mine, theirs in zip(value, saved[key], strict=True))
            else:
                assert value == saved[key], key
    same_layout = run_on_ranks(train_moe, 4, [*flags, "2", "--load", str(tmp_path / "ep2")])[0]
    assert same_layout[0] == straight[0][2:] and same_layout[2] == straight[2]
    one_process = run_on_ranks(train_moe, 1, [*flags, "1", "--load", str(tmp_path / "ep1")])[0][0]
    assert one_process == pytest.approx(straight[0][2:], rel=1e-4)
    assert_resumed_with_the_adam_state(lambda argv: run_on_ranks(train_moe, 1, argv), [*flags, "1"], tmp_path / "ep1",
                                       2, tmp_path / "held")
    with pytest.raises(AssertionError, match="cut into ZeRO partitions for data-parallel size 1, and this run's is 2 "
                                             r"\(DeepSpeed re-partitions none\); resume it at data-parallel size 1"):
        run_on_ranks(train_moe, 2, [*flags, "1", "--load", str(tmp_path / "ep1")])


def load_into_deepspeeds_fp16_optimizer(state, loss_scale):
    """DeepSpeed's FP16_UnfusedOptimizer (what the engine wraps torch's AdamW in at ZeRO 0 with --fp16) over a
    half-precision PR-MoE model in DeepSpeed's MoE groups (upstream's scripts pass --create-moe-param-group),
    loading `state` with its own load_state_dict; returns its master weights, the inner AdamW's moments (both
    in group order) and its loss scale."""
    import deepspeed
    from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer
    from deepspeed.runtime.fp16.loss_scaler import LossScaleConfig, LossScaleProfile
    from deepspeed.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer

    from megatron.training.optimizer import parameter_groups
    deepspeed.init_distributed("gloo", verbose=False)
    model = skewed_model("--mlp-type", "residual").half()
    dynamic = {"init_scale": 2.0 ** 8, "scale_window": 10, "min_scale": 1, "delayed_shift": 2,
               "consecutive_hysteresis": False}
    config = LossScaleConfig(torch.float16, True, 1.0, dynamic, profile=LossScaleProfile.UNFUSED)
    groups = split_params_into_different_moe_groups_for_optimizer(parameter_groups(model, 0.01))
    optimizer = FP16_UnfusedOptimizer(torch.optim.AdamW(groups, lr=1e-2),
                                      loss_scale_config=config, low_precision_dtype=torch.float16)
    optimizer.load_state_dict(state)
    masters = [p.detach().clone() for group in optimizer.fp32_groups for p in group]
    moments = [{kind: optimizer.optimizer.state[p][kind] for kind in ("exp_avg", "exp_avg_sq")}
               for group in optimizer.fp32_groups for p in group]
    scale = {key: getattr(optimizer.loss_scale_config, key) for key in loss_scale}
    return masters, moments, scale


def fused_fp16_optimizer_state(config, weights):
    """DeepSpeed's FP16_Optimizer (how upstream's trainer, stepping DeepSpeed's FusedAdam, wraps it in fp16 at
    ZeRO 0) over a half-precision copy of an MoE model in DeepSpeed's MoE groups, its flat moments and master
    weights filled at random: its state_dict(), and per parameter name the same tensors as DeepSpeed's own
    unflattening (torch's _unflatten_dense_tensors over the group's parameters) cuts them."""
    import deepspeed
    from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer
    from deepspeed.runtime.fp16.fused_optimizer import FP16_Optimizer
    from deepspeed.runtime.fp16.loss_scaler import LossScaleConfig
    from torch._utils import _unflatten_dense_tensors

    from megatron.model.moe import MoEGPTModel
    from megatron.training.optimizer import parameter_groups
    deepspeed.init_distributed("gloo", verbose=False)
    model = MoEGPTModel(config)
    model.load_state_dict(weights)
    model.half()
    groups = split_params_into_different_moe_groups_for_optimizer(parameter_groups(model, 0.01))
    scale = LossScaleConfig(torch.float16, True, 1.0, None)
    optimizer = FP16_Optimizer(torch.optim.AdamW(groups, lr=1e-2), loss_scale_config=scale, has_moe_layers=True)
    generator = torch.Generator().manual_seed(1)
    names = {parameter: name for name, parameter in model.named_parameters()}
    expected = {}
    for flat, parameters in zip(optimizer.fp32_groups_flat, optimizer.fp16_groups):
        tensors = {"fp32": flat.data, **optimizer.optimizer.state[flat]}
        for kind in ("fp32", "exp_avg", "exp_avg_sq"):
            tensors[kind].copy_(torch.rand(flat.shape, generator=generator))
            for parameter, piece in zip(parameters, _unflatten_dense_tensors(tensors[kind], parameters)):
                expected.setdefault(names[parameter], {})[kind] = piece.clone()
    return optimizer.state_dict(), expected


def test_upstreams_fp16_moe_adam_state_in_flat_groups_is_read_per_parameter(tmp_path):
    # Upstream's trainer steps fp16 with DeepSpeed's FusedAdam, so its expp_rank files hold FP16_Optimizer's flat
    # groups; the reader cuts them into the parameters DeepSpeed's own unflattening gives.
    from megatron.checkpoint.formats import expert_optimizer_state as experts
    from megatron.checkpoint.formats.mixed_precision_state import LOSS_SCALE_KEYS
    from megatron.checkpoint.formats.reader import read_checkpoint
    from megatron.checkpoint.torch_files import save
    from megatron.checkpoint.reshape.target_writer import TargetLayout, TrainingState, write_checkpoint
    from megatron.config.arguments import job_config
    from megatron.model.gpt_config import gpt_config
    from megatron.model.moe import MoEGPTModel
    flags = job_config(validated("--num-experts", "4", "--no-pipeline-parallel", "--num-layers", "2", "--mlp-type",
                                 "residual", world_size=1))
    config = gpt_config(flags.model, 256, moe=flags.moe)
    weights = MoEGPTModel(config).state_dict()
    write_checkpoint(str(tmp_path), weights, config, TrainingState(2, 8, flags.flags), TargetLayout(1, 1, False))
    saved, expected = run_on_ranks(fused_fp16_optimizer_state, 1, config, weights)[0]
    save(str(tmp_path / "global_step2" / "expp_rank_0_mp_rank_00_optim_states.pt"), {"optimizer": saved})
    checkpoint = read_checkpoint(str(tmp_path))
    files = experts.rank_files(checkpoint, 1)
    read = {kind: {name: files.read((rank, 0), {name: tensor})[name] for name, (rank, tensor) in by_name.items()}
            for kind, by_name in experts.read_rank_state(checkpoint, files, 0).items()}
    assert read["fp32"].keys() == expected.keys() == weights.keys()
    for name, kinds in expected.items():
        for kind, tensor in kinds.items():
            torch.testing.assert_close(read[kind][name], tensor, rtol=0, atol=0, msg=f"{kind} {name}")
    assert experts.saved_loss_scale(files) == {key: saved[key] for key in LOSS_SCALE_KEYS}


def test_an_moe_ranks_adam_state_in_fp16s_form_loads_into_deepspeeds_fp16_optimizer():
    # The converter's fp16 target (--target-fp16) against DeepSpeed's own loader: the master weights, moments and
    # an fp16 source's dynamic loss scale come back as written, in torch's numbering of DeepSpeed's MoE groups.
    from megatron.checkpoint.formats.expert_optimizer_state import rank_optimizer, state_order
    from megatron.checkpoint.formats.mixed_precision_state import target_loss_scale
    from megatron.checkpoint.formats.checkpoint import OptimizerState
    model = skewed_model("--mlp-type", "residual")
    parameters = dict(model.named_parameters())
    order = state_order(list(parameters), lambda name: parameters[name].dim() > 1, expert_groups=True)
    generator = torch.Generator().manual_seed(0)
    kinds = {kind: {name: torch.rand(p.shape, generator=generator) for name, p in parameters.items()}
             for kind in ("fp32", "exp_avg", "exp_avg_sq")}
    hyper = {"lr": 1e-2, "betas": (0.9, 0.999), "eps": 1e-8, "amsgrad": False, "maximize": False, "foreach": None,
             "capturable": False, "differentiable": False, "fused": None}
    full = OptimizerState(step=7, param_groups=({**hyper, "weight_decay": 0.01}, {**hyper, "weight_decay": 0.0}),
                          **kinds)
    source_scale = {"dynamic_loss_scale": True, "cur_scale": 512.0, "cur_iter": 7, "last_overflow_iter": 3,
                    "scale_factor": 2.0, "scale_window": 10}
    loss_scale = target_loss_scale("fp16", {}, 7, source_scale, "fp16")
    written = rank_optimizer({name: p.detach() for name, p in parameters.items()}, full, True, 0, 1, 0, 1,
                             loss_scale=loss_scale)["optimizer"]
    masters, moments, scale = run_on_ranks(load_into_deepspeeds_fp16_optimizer, 1, written, loss_scale)[0]
    assert scale == source_scale
    for index, name in enumerate(order):
        torch.testing.assert_close(masters[index], kinds["fp32"][name], rtol=0, atol=0, msg=name)
        for kind in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(moments[index][kind], kinds[kind][name], rtol=0, atol=0, msg=name)
    # From an fp32 or bf16 source, the scale an fp16 engine of the recorded flags starts with, steps kept.
    assert target_loss_scale("fp16", {"initial_loss_scale": 4096.0, "loss_scale_window": 100}, 7, None, "bf16") == {
        "dynamic_loss_scale": True, "cur_scale": 4096.0, "cur_iter": 7, "last_overflow_iter": -1, "scale_factor": 2.0,
        "scale_window": 100}


def test_the_adam_state_of_an_moe_checkpoint_trained_with_tensor_parallelism_is_refused_in_one_line():
    # DeepSpeed's consecutive expert-parallel groups then mix tensor-parallel ranks: a layout no run here wrote.
    from megatron.checkpoint.reshape.conversions import check_expert_target
    from megatron.checkpoint.formats.detect import Layout
    from megatron.checkpoint.formats.checkpoint import Checkpoint
    from megatron.checkpoint.reshape.target_writer import TargetLayout
    from megatron.errors import InputError
    args = {"num_layers": 2, "num_experts": [4], "moe_expert_parallel_size": 2}
    source = Checkpoint(directory="ckpt/global_step2", iteration=2, consumed_train_samples=8, args=args,
                        layout=Layout(tensor=2, pipeline=1, data=2, zero_stage=0, pipeline_engine=False),
                        padded_vocab_size=256, model={}, has_optimizer_state=True)
    target = TargetLayout(1, 1, pipeline_engine=False)
    with pytest.raises(InputError) as caught:
        check_expert_target("ckpt", source, target, weights_only=False)
    assert "trained at tensor-parallel size 2, whose per-rank Adam state is not regrouped; add --weights-only" in \
        str(caught.value) and "\n" not in str(caught.value)
    check_expert_target("ckpt", source, target, weights_only=True)


@pytest.mark.parametrize("expert_groups", [False, True], ids=["our-groups", "deepspeeds-moe-groups"])
def test_an_moe_ranks_adam_state_is_numbered_and_grouped_as_torch_and_deepspeed_do(expert_groups):
    # The converter names each index of an expp_rank file's AdamW state_dict by rule (module order, then groups);
    # here the rule meets the real thing: a PR-MoE layer (experts between its gate and its dense MLP) under our
    # groups or DeepSpeed's MoE split, one AdamW step, and the state written back loads into a fresh optimizer.
    from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer

    from megatron.checkpoint.formats.expert_optimizer_state import module_order, rank_names, rank_optimizer, state_order
    from megatron.checkpoint.formats.checkpoint import OptimizerState
    from megatron.training.optimizer import parameter_groups

    def adam(model):
        groups = parameter_groups(model, 0.01)
        return torch.optim.AdamW(split_params_into_different_moe_groups_for_optimizer(groups) if expert_groups
                                 else groups, lr=1e-2)

    model = skewed_model("--mlp-type", "residual")
    parameters = dict(model.named_parameters())
    names = list(parameters)
    experts = [name for name in names if is_expert_parameter(name)]
    by_expert_backwards = sorted(experts, key=lambda name: -int(name.split(".")[6]))  # as the reader may list them
    assert module_order([name for name in names if name not in experts] + by_expert_backwards) == names
    assert {name.split(".")[6] for name in rank_names(names, 1, 2) if name in experts} == {"2", "3"}
    optimizer = adam(model)
    tokens = torch.randint(0, 200, (2, 32))
    model(tokens, labels=tokens).backward()
    optimizer.step()
    saved = optimizer.state_dict()
    order = state_order(names, lambda name: parameters[name].dim() > 1, expert_groups)
    by_parameter = {parameter: name for name, parameter in parameters.items()}
    assert order == [by_parameter[p] for group in optimizer.param_groups for p in group["params"]]

    moments = {kind: {name: saved["state"][index][kind] for index, name in enumerate(order)}
               for kind in ("exp_avg", "exp_avg_sq")}
    full = OptimizerState(step=1, fp32={}, param_groups=tuple(saved["param_groups"][:2]), **moments)
    weights = {name: p.detach() for name, p in parameters.items()}
    written = rank_optimizer(weights, full, expert_groups, 0, 1, 0, 1)
    assert [len(g["params"]) for g in written["optimizer"]["param_groups"]] == \
        [len(g["params"]) for g in saved["param_groups"]]
    fresh = adam(model)
    fresh.load_state_dict(written["optimizer"])
    for name, parameter in parameters.items():
        for kind in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(fresh.state[parameter][kind], optimizer.state[parameter][kind], rtol=0,
                                       atol=0, msg=name)
    # At tensor-parallel size 2 an expert's moments are cut as its weights are: whole, or with
    # --enable-expert-tensor-parallelism its rows split as the column-parallel first linear's.
    expert = next(name for name in order if is_expert_parameter(name) and name.endswith("dense_h_to_4h.weight"))
    for split, expected in ((False, moments["exp_avg"][expert]), (True, moments["exp_avg"][expert].chunk(2)[1])):
        second = rank_optimizer(weights, full, expert_groups, 0, 1, 1, 2, split)["optimizer"]["state"]
        torch.testing.assert_close(second[order.index(expert)]["exp_avg"], expected, rtol=0, atol=0)


def test_a_converted_moe_checkpoints_adam_state_resumes_only_where_deepspeed_reads_it_and_says_how_else():
    from megatron.checkpoint.formats.detect import Layout
    from megatron.checkpoint.trainer.resume_plan import check_expert_optimizer_state
    from megatron.errors import InputError

    def run(zero_stage, data=2):
        return Layout(tensor=1, pipeline=1, data=data, zero_stage=zero_stage, pipeline_engine=False)
    bf16_for_dp2 = {"optimizer_precision": "bf16", "optimizer_data_parallel_size": 2}
    check_expert_optimizer_state("ckpt", bf16_for_dp2, run(0, data=8), "bf16")  # ZeRO 0: any DP
    check_expert_optimizer_state("ckpt", bf16_for_dp2, run(1), "fp16")  # ZeRO 1-2: any precision, its DP
    check_expert_optimizer_state("ckpt", {}, run(0), "fp32")  # earlier converters: fp32 ZeRO 0 only
    for state, layout, precision, message in (
            ({}, run(0), "bf16", "converted for fp32 training and this run trains in bf16; resume it with neither "
                                 "--fp16 nor --bf16, convert it again with tools/convert_checkpoint.py --target-bf16"),
            (bf16_for_dp2, run(0), "fp16", "resume it with --bf16, convert it again with tools/convert_checkpoint.py "
                                           "--target-fp16, or pass --no-load-optim"),
            ({"optimizer_precision": "bf16"}, run(2, data=4), "bf16", "load at ZeRO stage 0 only; resume it with "
                                                                      "--zero-stage 0, or pass --no-load-optim (or "
                                                                      "convert it again with "
                                                                      "--target-data-parallel-size 4 for ZeRO 1-2)"),
            (bf16_for_dp2, run(1, data=4), "bf16", "for data-parallel size 2, and this run's is 4")):
        with pytest.raises(InputError) as caught:
            check_expert_optimizer_state("ckpt", state, layout, precision)
        assert message in str(caught.value) and "\n" not in str(caught.value)


def test_zero_partitions_are_written_only_where_deepspeeds_expert_groups_are_known(tmp_path):
    from megatron.checkpoint.reshape.conversions import check_expert_target, reshape
    from megatron.checkpoint.formats.detect import Layout
    from megatron.checkpoint.formats.checkpoint import Checkpoint
    from megatron.checkpoint.reshape.target_writer import TargetLayout, TrainingState, write_checkpoint
    from megatron.config.arguments import job_config
    from megatron.errors import InputError
    from megatron.model.gpt import GPTModel
    from megatron.model.gpt_config import gpt_config
    args = {"num_layers": 2, "num_experts": [4], "moe_expert_parallel_size": 2}
    source = Checkpoint(directory="ckpt/global_step2", iteration=2, consumed_train_samples=8, args=args,
                        layout=Layout(tensor=1, pipeline=1, data=2, zero_stage=0, pipeline_engine=False),
                        padded_vocab_size=256, model={}, has_optimizer_state=True)
    for target, message in ((TargetLayout(1, 1, False, expert=2, data=3), "--target-data-parallel-size 3 is not a "
                                                                          "multiple of the target's expert-parallel "
                                                                          "size 2"),
                            (TargetLayout(2, 1, False, expert=2, data=2), "ZeRO partitions are written for "
                                                                          "tensor-parallel size 1 only")):
        with pytest.raises(InputError, match=message):
            check_expert_target("ckpt", source, target, weights_only=False)
    dense = job_config(validated("--num-layers", "2", world_size=1))
    config = gpt_config(dense.model, 256)
    write_checkpoint(str(tmp_path / "dense"), GPTModel(config).state_dict(), config, TrainingState(2, 8, dense.flags),
                     TargetLayout(1, 1, pipeline_engine=False))
    with pytest.raises(InputError, match="--target-data-parallel-size cuts the Adam state of .*, a dense model, only "
                                         "for the pipeline engine in bf16"):
        reshape(str(tmp_path / "dense"), str(tmp_path / "out"), TargetLayout(1, 1, False, data=2))


def test_the_converters_precision_and_data_parallel_flags():
    from tools.convert_checkpoint import parse_args
    base = ["--load", "in", "--save", "out", "--target-no-pipeline-parallel"]
    assert (parse_args(base).target_precision, parse_args(base).target_data_parallel_size) == (None, None)
    args = parse_args([*base, "--target-fp16", "--target-data-parallel-size", "8"])
    assert (args.target_precision, args.target_data_parallel_size) == ("fp16", 8)
    assert parse_args([*base, "--target-bf16"]).target_precision == "bf16"
    with pytest.raises(SystemExit):
        parse_args([*base, "--target-fp32", "--target-bf16"])


def test_reshaping_an_moe_checkpoint_with_its_adam_state_parses_each_expert_parallel_ranks_file_once(tmp_path):
    # ZeRO 0 keeps an MoE run's Adam state in one expp_rank file per expert-parallel rank; every kind of every
    # parameter comes from those files parsed once (the parses a weights-only reshape makes aside).
    from megatron.checkpoint.reshape.conversions import reshape
    from tools.fixtures.checkpoint_sources import write_zero0
    from megatron.checkpoint.formats.checkpoint import OptimizerState
    from megatron.config.recorded_flags import RecordedFlags
    from megatron.checkpoint.reshape.target_writer import TargetLayout, TrainingState
    from megatron.config.arguments import job_config
    from megatron.model.gpt_config import gpt_config
    from megatron.model.moe import MoEGPTModel
    from tests.checkpoint.formats.test_weight_units import parses
    flags = job_config(validated("--num-experts", "4", "--no-pipeline-parallel", "--num-layers", "2",
                                 "--moe-expert-parallel-size", "2", world_size=2))
    config = gpt_config(flags.model, 256, moe=flags.moe)
    weights = MoEGPTModel(config).state_dict()
    moments = {name: torch.rand(weight.shape) for name, weight in weights.items()}
    adam = OptimizerState(step=2, fp32=weights, exp_avg=moments, exp_avg_sq=moments,
                          param_groups=RecordedFlags.of(flags.flags).adam_param_groups)
    src = str(tmp_path / "src")
    write_zero0(src, weights, config, TrainingState(2, 8, flags.flags), TargetLayout(1, 1, False, expert=2), adam)
    with parses(src) as weights_only:
        reshape(src, str(tmp_path / "weights"), TargetLayout(1, 1, False), weights_only=True)
    with parses(src) as with_adam:
        reshape(src, str(tmp_path / "adam"), TargetLayout(1, 1, False))
    added = with_adam - weights_only
    assert sorted(path for path in added if "expp_rank" in path) == [
        f"global_step2/expp_rank_{rank}_mp_rank_00_optim_states.pt" for rank in range(2)]
    assert {path: count for path, count in added.items() if count != 1} == {}
