"""The layout planner (megatron/planning, tools/plan_layout.py): its model-state terms equal the tensors of a built
model per rank (dense and mixture-of-experts), and its table, JSON and refusals."""
import json
from dataclasses import replace

import pytest
import torch

from megatron.errors import InputError
from megatron.planning.memory import estimate_memory, layer_activation_bytes
from megatron.planning.search import candidate_layouts, require_fit
from megatron.config.job import MoEConfig
from megatron.planning.shape import (Layout, ModelShape, TrainingSettings, from_flags, stage_expert_parameters,
                                     stage_parameters)
from tests.helpers.distributed import run_on_ranks
from tests.helpers.training import TINY_FLAGS, VOCAB

SHAPE = ModelShape(num_layers=4, hidden_size=32, num_attention_heads=4, seq_length=16, max_position_embeddings=16,
                   vocab_size=200, make_vocab_size_divisible_by=64)
# Llama-style: RMSNorm, no position table (rotary), SwiGLU, 2 key/value heads, no linear biases, untied head.
LLAMA_SHAPE = ModelShape(**{**vars(SHAPE), "ffn_hidden_size": 48, "normalization": "rmsnorm",
                            "add_position_embedding": False, "use_rotary_position_embeddings": True,
                            "swiglu": True, "num_key_value_heads": 2,
                            "add_bias_linear": False, "untie_embeddings_and_output_weights": True})
FP32 = TrainingSettings(global_batch_size=4, dtype="fp32", pipeline_engine=False)


def gpt_config(tensor: int, shape: ModelShape = SHAPE):
    from megatron.model.gpt import GPTConfig
    return GPTConfig(vocab_size=shape.padded_vocab(tensor), max_position_embeddings=shape.max_position_embeddings,
                     num_layers=shape.num_layers, hidden_size=shape.hidden_size,
                     num_attention_heads=shape.num_attention_heads, hidden_dropout=0.0, attention_dropout=0.0,
                     ffn_hidden_size=shape.ffn, normalization=shape.normalization,
                     add_position_embedding=shape.add_position_embedding,
                     use_rotary_position_embeddings=shape.use_rotary_position_embeddings, swiglu=shape.swiglu,
                     num_key_value_heads=shape.key_value_heads, add_bias_linear=shape.add_bias_linear,
                     untie_embeddings_and_output_weights=shape.untie_embeddings_and_output_weights)


def tensor_bytes(tensors) -> int:
    return sum(tensor.numel() * tensor.element_size() for tensor in tensors)


def test_model_state_terms_equal_the_tensors_of_a_trained_model():
    """fp32, ZeRO 0, one device: weights, gradients and Adam's moments after a real step, byte for byte."""
    from megatron.model.gpt import GPTModel

    model = GPTModel(gpt_config(1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, 200, (2, SHAPE.seq_length + 1))
    model(tokens[:, :-1], labels=tokens[:, 1:]).backward()
    optimizer.step()
    memory = estimate_memory(SHAPE, Layout(1, 1, 1, 0, 2, False, False), FP32)
    assert memory.weights == tensor_bytes(model.parameters())
    assert memory.gradients == tensor_bytes(p.grad for p in model.parameters())
    moments = [state[key] for state in optimizer.state.values() for key in ("exp_avg", "exp_avg_sq")]
    assert memory.optimizer == tensor_bytes(moments)
    assert memory.step_gradients == 0 and memory.buckets == 0  # fp32 ZeRO 0: the step reads the gradients as they are


def count_parameters_per_rank(shape: ModelShape):
    import deepspeed

    from megatron.model.gpt import GPTModel
    from megatron.model.parallelize import apply_tensor_parallel
    from megatron.model.pipe import GPTPipe
    from megatron.parallel_state import ParallelState
    from megatron.tensor_parallel import tensor_parallel_rng_tracker

    deepspeed.init_distributed("gloo", verbose=False)
    parallel = ParallelState(tensor_parallel_size=2, pipeline_parallel_size=2)
    tracker = tensor_parallel_rng_tracker(5, parallel.tp_rank)
    stage = GPTPipe(gpt_config(2, shape), parallel, tracker)
    plain = apply_tensor_parallel(GPTModel(gpt_config(2, shape)), parallel, rng_tracker=tracker)
    return (parallel.pp_rank, sum(p.numel() for p in stage.parameters()), sum(p.numel() for p in plain.parameters()))


@pytest.mark.full
@pytest.mark.parametrize("shape", [SHAPE, LLAMA_SHAPE], ids=["gpt2", "llama"])
def test_parameters_per_rank_equal_a_built_model_at_tp2_pp2(shape):
    for pp_rank, pipeline_stage, plain_tp2 in run_on_ranks(count_parameters_per_rank, 4, shape):
        assert pipeline_stage == stage_parameters(shape, 2, 2, pp_rank)
        assert plain_tp2 == stage_parameters(shape, 2, 1, 0, pipeline_engine=False)


def test_zero_stages_divide_what_they_shard():
    bf16 = TrainingSettings(global_batch_size=8)
    memory = {zero: estimate_memory(SHAPE, Layout(1, 1, 4, zero, 2, False, False), bf16) for zero in range(4)}
    parameters = stage_parameters(SHAPE, 1, 1, 0)
    assert memory[0].optimizer == 12 * parameters and memory[1].optimizer == 3 * parameters
    assert memory[1].gradients == 2 * parameters and memory[2].gradients == parameters / 2
    assert memory[2].weights == 2 * parameters and memory[3].weights == parameters / 2


def test_recompute_and_sequence_parallelism_shrink_activations_and_the_first_stage_holds_the_most_in_flight():
    bf16 = TrainingSettings(global_batch_size=64, zero_reduce_bucket_size=1000)  # a bucket to scale
    def memory(**change):
        return estimate_memory(SHAPE, Layout(**{"tensor": 2, "pipeline": 1, "data": 1, "zero_stage": 1,
                                                "micro_batch": 2, "recompute": False, "sequence_parallel": False,
                                                **change}), bf16)
    assert memory(recompute=True).activations < memory(sequence_parallel=True).activations < memory().activations
    pipelined = memory(pipeline=4, tensor=1, micro_batch=8)  # activations outweigh the last stage's logits
    assert pipelined.pipeline_in_flight == 3 * pipelined.activations and pipelined.stage == 0


def test_layouts_respect_the_trainers_rules():
    layouts = list(candidate_layouts(SHAPE, TrainingSettings(global_batch_size=8), devices=8, devices_per_node=4))
    assert layouts and all(layout.devices == 8 and layout.tensor <= 4 for layout in layouts)
    assert all(layout.pipeline == 1 for layout in layouts if layout.zero_stage >= 2)
    assert all(layout.tensor > 1 and layout.zero_stage <= 1 for layout in layouts if layout.sequence_parallel)
    assert all(8 % (layout.micro_batch * layout.data) == 0 for layout in layouts)


def test_a_layout_that_does_not_fit_is_refused_naming_its_largest_term():
    memory = estimate_memory(SHAPE, Layout(1, 1, 1, 0, 2, False, False), FP32)
    require_fit(memory, memory.total, "--skip_memory_check")
    with pytest.raises(InputError, match=r"the largest term is \w+.*--skip_memory_check"):
        require_fit(memory, memory.total / 2, "--skip_memory_check")


def test_each_recompute_mode_keeps_what_it_should():
    """Upstream main's modes: block keeps the inputs of its recomputed layers and everything of the others;
    selective drops only unfused attention's score matrices."""
    from megatron.planning.memory import layer_activation_bytes, stage_activation_bytes
    unfused = TrainingSettings(global_batch_size=64, fused_attention=False)

    def activations(**change):
        layout = Layout(**{"tensor": 1, "pipeline": 1, "data": 1, "zero_stage": 1, "micro_batch": 2,
                           "recompute": False, "sequence_parallel": False, **change})
        return stage_activation_bytes(SHAPE, layout, unfused), layer_activation_bytes(SHAPE, layout, unfused)

    (none, layer), (every, _) = activations(), activations(recompute=True)
    layer_input = SHAPE.seq_length * 2 * SHAPE.hidden_size * unfused.dtype_bytes
    assert every == 4 * layer_input + layer and none == 4 * layer
    assert activations(recompute=True, recompute_layers=1)[0] == layer_input + 3 * layer
    assert activations(recompute=True, recompute_layers=9)[0] == every
    scores = SHAPE.num_attention_heads * SHAPE.seq_length ** 2 * 2 * unfused.dtype_bytes
    assert activations(selective_recompute=True)[1] == layer - scores


def test_from_flags_reads_the_recompute_flags():
    from megatron.config.arguments import parse_args, validate_args
    base = ["--model-size", "tiny", "--tokenizer-type", "NullTokenizer", "--vocab-size", "100", "--mock-data",
            "--no-checkpoint-activations"]
    for extra, recompute, layers, selective in (
            ("--recompute-granularity full --recompute-method uniform", True, None, False),
            ("--recompute-granularity full --recompute-method block --recompute-num-layers 2", True, 2, False),
            ("--recompute-activations", False, None, True)):
        _, layout, _ = from_flags(validate_args(parse_args(base + extra.split()), 4, "cpu"), 100)
        assert (layout.recompute, layout.recompute_layers, layout.selective_recompute) == (recompute, layers,
                                                                                           selective), extra


def test_from_flags_reads_a_pretrain_command_line():
    from megatron.config.arguments import parse_args, validate_args
    flags = validate_args(parse_args(["--model-size", "1.3B", "--tokenizer-type", "NullTokenizer", "--vocab-size",
                                      "50257", "--mock-data", "--bf16", "--sequence-parallel"]), 8, "cuda")
    shape, layout, settings = from_flags(flags, 50257)
    assert (shape.num_layers, shape.hidden_size, shape.padded_vocab(2)) == (24, 2048, 50432)
    assert settings.dtype == "bf16" and layout == Layout(2, 2, 2, 1, 8, True, True)


def test_a_command_lines_plan_follows_the_attention_kernel_it_trains_with():
    """Grouped-query Llama flags: the planner counts repeated K/V for the device's own kernel and none for one that
    takes them grouped (the Ascend fusion attention's `takes_grouped_kv`); the rest of the plan is the same."""
    from megatron.config.arguments import parse_args, validate_args
    from megatron.planning.command_line import planned_memory
    argv = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "8", "--num-key-value-heads", "2",
            "--seq-length", "128", "--micro-batch-size", "2", "--lr", "1e-4", "--train-iters", "10", "--swiglu",
            "--tokenizer-type", "NullTokenizer", "--vocab-size", "200", "--mock-data", "--bf16"]
    repeated, grouped = (planned_memory(argv, 1, "cpu", attention=attention)
                         for attention in (None, GroupedKVAttention()))
    assert repeated.weights == grouped.weights and repeated.activations != grouped.activations
    shape, layout, settings = from_flags(validate_args(parse_args(argv), 1, "cpu"), 200)
    assert grouped.activations == estimate_memory(shape, layout, replace(settings, kv_repeated=False)).activations


def test_the_launchers_estimate_counts_the_zero_stage_the_run_will_use():
    """The issue's 680M GPT at TP 2 over one data-parallel rank (fp32): the default stage there is ZeRO 0, which
    the estimate counts without ZeRO 1's flat fp32 copies; --zero-stage 1 counts them."""
    from megatron.config.arguments import parse_args, validate_args
    shape = ["--num-layers", "24", "--hidden-size", "1536", "--num-attention-heads", "16", "--seq-length", "1024",
             "--micro-batch-size", "1", "--lr", "1e-4", "--train-iters", "10", "--tokenizer-type", "NullTokenizer",
             "--vocab-size", "50257", "--mock-data", "--tensor-model-parallel-size", "2"]
    estimates = {}
    for stage in ([], ["--zero-stage", "1"]):
        _, layout, settings = planned = from_flags(validate_args(parse_args(shape + stage), 2, "cpu"), 50257)
        estimates[layout.zero_stage] = estimate_memory(*planned)
    assert sorted(estimates) == [0, 1]
    assert estimates[0].optimizer < estimates[1].optimizer and estimates[0].total < estimates[1].total


def test_plan_layout_tool_table_and_json(capsys):
    from tools.plan_layout import main
    assert main(["--model-size", "1.3B", "--devices", "8", "--device-memory", "24", "--top", "5"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert "fit in 24 GiB" in table[0] and table[1].startswith("| TP | PP | DP | ZeRO | mbs |") and len(table) == 8
    assert all(row.split(" | ")[-3] == "yes" for row in table[3:])
    main(["--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
          "--global-batch-size", "8", "--vocab-size", "200", "--zero-reduce-bucket-size", "1000", "--devices", "2",
          "--device-memory", "1", "--json"])
    plans = json.loads(capsys.readouterr().out)["plans"]
    assert plans and all(plan["fits"] for plan in plans)
    assert {plan["layout"]["tensor"] for plan in plans} == {1, 2}
    with pytest.raises(InputError, match="--num-layers is needed without --model-size"):
        main(["--devices", "8", "--device-memory", "80"])


# --- mixture of experts ------------------------------------------------------------------------------------------

# PR-MoE with a pyramid of experts (layers 2 and 4 of 4), top-2: every part DeepSpeed's MoE layer can hold.
PYRAMID = MoEConfig(num_experts=(2, 4), expert_interval=2, mlp_type="residual", topk=2, train_capacity_factor=1.0,
                    eval_capacity_factor=1.0, min_capacity=4, token_dropping=True, loss_coeff=0.1,
                    create_param_group=False, expert_parallel_size=1)
MOE_SHAPE = ModelShape(**{**vars(SHAPE), "moe": PYRAMID})


def test_moe_model_state_terms_equal_the_tensors_of_a_trained_single_process_model():
    """EP 1, fp32, ZeRO 0: the gate, every expert, PR-MoE's dense MLP and coefficient, byte for byte after a step."""
    from megatron.model.gpt import GPTConfig
    from megatron.model.moe import MoEGPTModel, is_expert_parameter

    config = gpt_config(1)
    model = MoEGPTModel(GPTConfig(**{**vars(config), "moe": PYRAMID}))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, 200, (2, SHAPE.seq_length + 1))
    (model(tokens[:, :-1], labels=tokens[:, 1:])).backward()
    optimizer.step()
    memory = estimate_memory(MOE_SHAPE, Layout(1, 1, 1, 0, 2, False, False), FP32)
    assert memory.weights == tensor_bytes(model.parameters())
    assert memory.gradients == tensor_bytes(p.grad for p in model.parameters())
    moments = [state[key] for state in optimizer.state.values() for key in ("exp_avg", "exp_avg_sq")]
    assert memory.optimizer == tensor_bytes(moments)
    experts = sum(p.numel() for name, p in model.named_parameters() if is_expert_parameter(name))
    assert stage_expert_parameters(MOE_SHAPE, 1) == experts == 6 * (2 * 32 * 128 + 128 + 32)


def test_experts_split_over_tensor_parallel_ranks_count_their_shards():
    # --enable-expert-tensor-parallelism: each rank holds the plan's shards of its experts (the row-parallel bias
    # whole), counted here from a built single-process model by the plan's partition dims; without it, whole ones.
    from megatron.model.gpt import GPTConfig
    from megatron.model.moe import MoEGPTModel, is_expert_parameter
    from megatron.model.parallelize import tensor_parallel_partition_dim
    split = ModelShape(**{**vars(SHAPE), "moe": MoEConfig(**{**vars(PYRAMID), "expert_tensor_parallel": True})})
    model = MoEGPTModel(GPTConfig(**{**vars(gpt_config(2)), "moe": split.moe}))
    per_rank = {name: p.numel() // (1 if tensor_parallel_partition_dim(name, experts=True) is None else 2)
                for name, p in model.named_parameters()}
    assert stage_parameters(split, 2, 1, 0, pipeline_engine=False) == sum(per_rank.values())
    experts = sum(count for name, count in per_rank.items() if is_expert_parameter(name))
    assert stage_expert_parameters(split, 1, 2) == experts == 6 * ((2 * 32 * 128 + 128) // 2 + 32)
    assert stage_expert_parameters(MOE_SHAPE, 1, 2) == stage_expert_parameters(MOE_SHAPE, 1)  # whole experts


MOE_ZERO2_FLAGS = [*TINY_FLAGS, "--num-layers", "4", "--num-experts", "2", "4", "--mlp-type", "residual", "--topk",
                   "2", "--no-pipeline-parallel", "--moe-expert-parallel-size", "2", "--zero-stage", "2",
                   "--micro-batch-size", "1", "--global-batch-size", "4", "--train-iters", "2", "--mock-data",
                   "--eval-iters", "0"]


def moe_engine_states(argv):
    """This rank's model and DeepSpeed ZeRO optimizer after one step: parameter bytes (dense, experts); the bytes
    of the fp32 master partitions plus Adam's moments; and each optimizer group's parameter count and
    data-parallel size (the dense groups' all ranks, the experts' their expert-data-parallel ranks)."""
    import torch.distributed as dist

    from megatron.model.moe import is_expert_parameter
    from megatron.model.provider import model_provider
    from megatron.training.loop import build_trainer

    engine = build_trainer(model_provider, argv).engine
    tokens = torch.randint(0, VOCAB, (1, 33))
    engine.backward(engine(tokens[:, :-1], labels=tokens[:, 1:]))
    engine.step()
    named = list(engine.module.named_parameters())
    zero = engine.optimizer
    masters = zero.single_partition_of_fp32_groups
    moments = [zero.optimizer.state[master][key] for master in masters for key in ("exp_avg", "exp_avg_sq")]
    groups = [(sum(p.numel() for p in group), dist.get_world_size(zero.real_dp_process_group[i]))
              for i, group in enumerate(zero.bit16_groups)]
    return {"weights": tensor_bytes(p for _, p in named),
            "expert_parameters": sum(p.numel() for name, p in named if is_expert_parameter(name)),
            "optimizer": tensor_bytes([*masters, *moments]), "groups": groups}


@pytest.mark.full
def test_moe_states_per_rank_equal_deepspeed_at_ep2_zero2():
    """4 gloo ranks, EP 2 (DP 4, expert-data-parallel 2), ZeRO 2, fp32: each rank's weights (its experts only)
    exactly, and its ZeRO partitions of the fp32 master copy and Adam's moments: 12 bytes for each parameter's
    share of its group (dense over 4 ranks, experts over 2) exactly; what DeepSpeed allocates is that plus its
    alignment padding (each flat group padded to a multiple of 2 x its data-parallel size), which the planner
    leaves out."""
    from megatron.config.arguments import parse_args, validate_args
    shape, layout, settings = from_flags(validate_args(parse_args(MOE_ZERO2_FLAGS), 4, "cpu"), VOCAB)
    assert layout.expert_parallel == 2 and layout.data == 4 and shape.moe.topk == 2
    memory = estimate_memory(shape, layout, settings)
    for rank in run_on_ranks(moe_engine_states, 4, MOE_ZERO2_FLAGS):
        assert rank["expert_parameters"] == stage_expert_parameters(shape, 2)
        assert rank["weights"] == memory.weights
        assert {size for _, size in rank["groups"]} == {4, 2}
        assert sum(12 * count / size for count, size in rank["groups"]) == memory.optimizer
        padding = sum(12 * (-count % (2 * size)) / size for count, size in rank["groups"])
        assert rank["optimizer"] == memory.optimizer + padding


def test_moe_layouts_spread_experts_over_divisors_of_dp_without_pipeline_or_sequence_parallelism():
    layouts = list(candidate_layouts(MOE_SHAPE, TrainingSettings(global_batch_size=8, pipeline_engine=False),
                                     devices=8, devices_per_node=8))
    assert {layout.expert_parallel for layout in layouts} == {1, 2}  # 2 and 4 experts: EP must divide both
    assert all(layout.pipeline == 1 and not layout.sequence_parallel and layout.zero_stage <= 2
               and layout.data % layout.expert_parallel == 0 for layout in layouts)
    fixed = candidate_layouts(MOE_SHAPE, TrainingSettings(global_batch_size=8), 8, 8, expert_parallel=2)
    assert {layout.expert_parallel for layout in fixed} == {2}


def test_expert_states_shard_by_ep_and_partition_over_expert_data_parallel_ranks():
    bf16 = TrainingSettings(global_batch_size=8, pipeline_engine=False)
    def memory(ep, zero):
        return estimate_memory(MOE_SHAPE, Layout(1, 1, 4, zero, 1, False, False, ep), bf16)
    experts, everything = stage_expert_parameters(MOE_SHAPE, 1), stage_parameters(MOE_SHAPE, 1, 1, 0)
    dense = everything - experts
    assert stage_expert_parameters(MOE_SHAPE, 2) == experts / 2
    assert memory(2, 0).weights == 2 * (dense + experts / 2)
    assert memory(2, 1).optimizer == 12 * (dense / 4 + experts / 2 / 2)  # dense over DP 4, experts over DP/EP 2
    assert memory(2, 2).gradients == 2 * (dense / 4 + experts / 2 / 2)
    assert memory(1, 1).optimizer == 12 * everything / 4


def test_moe_activations_follow_capacity_and_all_to_all_time_follows_ep():
    from megatron.planning.moe import capacity
    from megatron.planning.step_time import Hardware, estimate_step_time
    assert capacity(PYRAMID, tokens=64, experts=4) == 32  # ceil(64 / 4 x 1.0 x top-2)
    assert capacity(PYRAMID, tokens=4, experts=4) == 4  # --moe-min-capacity
    roomy = ModelShape(**{**vars(SHAPE), "moe": MoEConfig(**{**vars(PYRAMID), "train_capacity_factor": 2.0})})
    settings = TrainingSettings(global_batch_size=8, pipeline_engine=False)
    layout = Layout(1, 1, 4, 1, 2, False, False, 2)
    activations = estimate_memory(MOE_SHAPE, layout, settings).activations
    assert estimate_memory(roomy, layout, settings).activations > activations
    hardware = Hardware(devices_per_node=8)
    assert estimate_step_time(MOE_SHAPE, layout, settings, hardware).expert_parallel > 0
    single = estimate_step_time(MOE_SHAPE, Layout(1, 1, 4, 1, 2, False, False, 1), settings, hardware)
    assert single.expert_parallel == 0
    dense_flops = estimate_step_time(SHAPE, Layout(1, 1, 4, 1, 2, False, False), settings, hardware).compute
    assert single.compute > dense_flops  # top-2 plus PR-MoE's MLP: three MLPs per token in layers 2 and 4


def test_plan_layout_tool_plans_moe_presets_and_flags(capsys):
    from tools.plan_layout import main
    assert main(["--model-size", "125M_MoE64", "--devices", "8", "--device-memory", "80", "--top", "3"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert "PP > 1 are left out" in table[0]
    assert table[1].startswith("| TP | PP | DP | ZeRO | mbs | recompute | SP | Ulysses | EP |") and len(table) == 6
    main(["--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
          "--global-batch-size", "8", "--vocab-size", "200", "--devices", "4", "--device-memory", "1", "--json",
          "--num-experts", "2", "4", "--mlp-type", "residual", "--topk", "2"])
    output = json.loads(capsys.readouterr().out)
    assert output["model"]["moe"]["num_experts"] == [2, 4]
    assert {plan["layout"]["expert_parallel"] for plan in output["plans"]} == {1, 2}
    assert all(plan["layout"]["pipeline"] == 1 and plan["layout"]["no_pipeline_parallel"] for plan in output["plans"])
    with pytest.raises(InputError, match="--num-experts 64 is not divisible by --moe-expert-parallel-size 3"):
        main(["--model-size", "125M_MoE64", "--devices", "6", "--device-memory", "80",
              "--moe-expert-parallel-size", "3"])


def test_the_launcher_estimates_an_moe_run_and_refuses_one_that_cannot_fit(capsys):
    from megatron.config.arguments import parse_args, validate_args
    from tools.launch_training import check_memory
    flags = validate_args(parse_args(["--model-size", "1.3B_MoE128", "--tokenizer-type", "NullTokenizer",
                                      "--vocab-size", "50257", "--mock-data", "--bf16"]), 8, "cuda")
    check_memory(flags, 50257, None, skip=False)  # a device of unknown memory (a CPU): printed only
    assert "Memory estimate (tools/plan_layout.py): " in capsys.readouterr().out
    memory = estimate_memory(*from_flags(flags, 50257))
    with pytest.raises(InputError, match="the largest term is optimizer"):
        require_fit(memory, 80 * (1 << 30), "--skip_memory_check")


def saved_activation_bytes(module: torch.nn.Module, inputs: torch.Tensor) -> int:
    """Bytes of the tensors autograd keeps for backward in one forward of `module` (each storage once; the
    module's own parameters are not activations)."""
    parameters = {p.untyped_storage().data_ptr() for p in module.parameters()}
    kept = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters:
            kept[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        module(inputs)
    return sum(kept.values())


@pytest.mark.parametrize("mlp_type, topk, experts", [("standard", 1, 64), ("residual", 2, 8)])
def test_moe_layer_activations_match_what_autograd_keeps(mlp_type, topk, experts):
    """bf16, one MoE layer of DeepSpeed's: the planner's gate, expert and combine tensors within 5% of those saved
    for backward (the rest are the gate's small top-k index tensors)."""
    from megatron.model.gpt import GPTConfig
    from megatron.model.moe import MoEGPTModel
    from megatron.planning.moe import mlp_activation_bytes

    moe = MoEConfig(**{**vars(PYRAMID), "num_experts": (experts,), "expert_interval": 1, "mlp_type": mlp_type,
                       "topk": topk})
    shape = ModelShape(**{**vars(SHAPE), "num_layers": 1, "hidden_size": 64, "seq_length": 128,
                          "max_position_embeddings": 128, "moe": moe})
    model = MoEGPTModel(GPTConfig(**{**vars(gpt_config(1)), "num_layers": 1, "hidden_size": 64,
                                     "ffn_hidden_size": 256, "max_position_embeddings": 128, "moe": moe}))
    layer = model.layers[0].mlp.to(torch.bfloat16)
    measured = saved_activation_bytes(layer, torch.randn(128, 2, 64, dtype=torch.bfloat16, requires_grad=True))
    estimate = mlp_activation_bytes(shape, Layout(1, 1, 1, 0, 2, False, False), TrainingSettings(8), experts)
    assert estimate == pytest.approx(measured, rel=0.05)


class GroupedKVAttention:
    """An attention kernel that takes grouped K/V unrepeated, as the Ascend fusion attention does (SDPA's
    enable_gqa keeps them so for backward): the model then makes no repeat, and the planner counts none."""
    takes_grouped_kv = True

    def __call__(self, query, key, value, spec):
        return torch.nn.functional.scaled_dot_product_attention(query, key, value, is_causal=True, enable_gqa=True)


@pytest.mark.parametrize("shape, attention", [
    (SHAPE, None), (LLAMA_SHAPE, None), (ModelShape(**{**vars(LLAMA_SHAPE), "num_key_value_heads": 4}), None),
    (LLAMA_SHAPE, GroupedKVAttention())], ids=["gpt2", "llama", "llama-without-gqa", "llama-kernel-takes-grouped-kv"])
def test_a_layers_activations_match_what_autograd_keeps(shape, attention):
    """bf16, one transformer layer (fused attention, no dropout): the planner's kept values within 5% of what
    autograd saves (SDPA's small log-sum-exp, the norms' per-token statistics and the rotary angles are left out).
    The K/V repeats are counted by the kernel's own answer (kernels.repeats_grouped_kv)."""
    from megatron.model.gpt import TransformerLayer
    from megatron.model.kernels import PORTABLE_KERNELS, repeats_grouped_kv

    shape = ModelShape(**{**vars(shape), "hidden_size": 64, "ffn_hidden_size": 2 * shape.ffn, "seq_length": 128,
                          "max_position_embeddings": 128})
    kernels = PORTABLE_KERNELS if attention is None else replace(PORTABLE_KERNELS, attention=attention)
    config = replace(gpt_config(1, shape), kernels=kernels)
    layer = TransformerLayer(config).to(torch.bfloat16)
    measured = saved_activation_bytes(layer, torch.randn(2, 128, 64, dtype=torch.bfloat16, requires_grad=True))
    settings = TrainingSettings(8, dtype="bf16", hidden_dropout=0.0, kv_repeated=repeats_grouped_kv(kernels.attention))
    estimate = layer_activation_bytes(shape, Layout(1, 1, 1, 0, 2, False, False), settings)
    assert estimate == pytest.approx(measured, rel=0.05)


def test_ulysses_divides_activations_and_zero_partitions_by_its_size():
    """DeepSpeed-Ulysses: each rank holds s/SP tokens (inside attention 1/SP of the heads over the whole sequence),
    whole weights, and ZeRO partitions over DP x SP; the search offers it only where the trainer runs it."""
    settings = TrainingSettings(global_batch_size=8, pipeline_engine=False, fused_attention=False)
    base = Layout(1, 1, 2, 1, 1, False, False)
    one, four = (estimate_memory(SHAPE, replace(base, ulysses=sp), settings) for sp in (1, 4))
    assert four.activations == pytest.approx(one.activations / 4)
    assert four.logits_and_loss < one.logits_and_loss and four.weights == one.weights
    assert four.optimizer == pytest.approx(one.optimizer / 4)
    from megatron.planning.step_time import Hardware, estimate_step_time
    hardware = Hardware(devices_per_node=8)
    assert estimate_step_time(SHAPE, replace(base, ulysses=4), settings, hardware).sequence_parallel > 0
    assert estimate_step_time(SHAPE, base, settings, hardware).sequence_parallel == 0
    layouts = list(candidate_layouts(SHAPE, settings, 8, 8))
    assert {layout.ulysses for layout in layouts} == {1, 2, 4}  # 8 would split SHAPE's 4 heads
    assert all((layout.tensor, layout.pipeline) == (1, 1) for layout in layouts if layout.ulysses > 1)
    assert {layout.ulysses for layout in candidate_layouts(SHAPE, replace(settings, pipeline_engine=True), 8, 8)} == {1}


def test_rope_scaling_changes_neither_the_plan_nor_the_flops():
    """Scaled rotary frequencies are the same element-wise work as unscaled ones: the planner's memory and step
    time and the FLOPs of the built model do not move."""
    from megatron.config.arguments import job_config, parse_args, validate_args
    from megatron.model.gpt import GPTModel
    from megatron.model.gpt_config import gpt_config
    from megatron.planning.step_time import Hardware, estimate_step_time
    from megatron.training.flops import LayerMatrices, flops_per_iteration

    llama = ["--model-size", "llama-tiny", "--tokenizer-type", "NullTokenizer", "--vocab-size", "100", "--mock-data"]
    planned, built = [], []
    for kind, scaling in ((None, []), ("llama3", ["--use-rope-scaling", "--rope-scaling-factor", "4"]),
                          ("yarn", ["--rope-scaling-type", "yarn", "--rope-scaling-factor", "4"])):
        flags = validate_args(parse_args(llama + scaling), 4, "cpu")
        shape, layout, settings = from_flags(flags, 100)
        planned.append((estimate_memory(shape, layout, settings),
                        estimate_step_time(shape, layout, settings, Hardware(devices_per_node=2))))
        model = job_config(flags).model
        assert model.rope_scaling_type == kind
        config = gpt_config(model, shape.padded_vocab(1))
        layer = LayerMatrices.of(config)
        built.append(((layer.attention, layer.mlp), flops_per_iteration(8, shape.seq_length, model.num_layers,
                                                                        model.hidden_size, 100, layer=layer),
                      sum(p.numel() for p in GPTModel(config).parameters())))
    assert planned[0] == planned[1] == planned[2] and built[0] == built[1] == built[2]
