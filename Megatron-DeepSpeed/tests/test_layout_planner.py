"""The layout planner (megatron/planning, tools/plan_layout.py): its model-state terms equal the tensors of a built
model per rank, and its table, JSON and refusals."""
import json

import pytest
import torch

from megatron.errors import InputError
from megatron.planning.memory import estimate_memory
from megatron.planning.search import candidate_layouts, require_fit
from megatron.planning.shape import Layout, ModelShape, TrainingSettings, from_flags, stage_parameters
from tests.distributed_helpers import run_on_ranks

SHAPE = ModelShape(num_layers=4, hidden_size=32, num_attention_heads=4, seq_length=16, max_position_embeddings=16,
                   vocab_size=200, make_vocab_size_divisible_by=64)
FP32 = TrainingSettings(global_batch_size=4, dtype="fp32", pipeline_engine=False)


def gpt_config(tensor: int):
    from megatron.model.gpt import GPTConfig
    return GPTConfig(vocab_size=SHAPE.padded_vocab(tensor), max_position_embeddings=SHAPE.max_position_embeddings,
                     num_layers=SHAPE.num_layers, hidden_size=SHAPE.hidden_size,
                     num_attention_heads=SHAPE.num_attention_heads, hidden_dropout=0.0, attention_dropout=0.0)


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


def count_parameters_per_rank():
    import deepspeed

    from megatron.model.gpt import GPTModel
    from megatron.model.parallelize import apply_tensor_parallel
    from megatron.model.pipe import GPTPipe
    from megatron.parallel_state import ParallelState
    from megatron.tensor_parallel import tensor_parallel_rng_tracker

    deepspeed.init_distributed("gloo", verbose=False)
    parallel = ParallelState(tensor_parallel_size=2, pipeline_parallel_size=2)
    tracker = tensor_parallel_rng_tracker(5, parallel.tp_rank)
    stage = GPTPipe(gpt_config(2), parallel, tracker)
    plain = apply_tensor_parallel(GPTModel(gpt_config(2)), parallel, rng_tracker=tracker)
    return (parallel.pp_rank, sum(p.numel() for p in stage.parameters()), sum(p.numel() for p in plain.parameters()))


@pytest.mark.full
def test_parameters_per_rank_equal_a_built_model_at_tp2_pp2():
    for pp_rank, pipeline_stage, plain_tp2 in run_on_ranks(count_parameters_per_rank, 4):
        assert pipeline_stage == stage_parameters(SHAPE, 2, 2, pp_rank)
        assert plain_tp2 == stage_parameters(SHAPE, 2, 1, 0, pipeline_engine=False)


def test_zero_stages_divide_what_they_shard():
    bf16 = TrainingSettings(global_batch_size=8)
    memory = {zero: estimate_memory(SHAPE, Layout(1, 1, 4, zero, 2, False, False), bf16) for zero in range(4)}
    parameters = stage_parameters(SHAPE, 1, 1, 0)
    assert memory[0].optimizer == 12 * parameters and memory[1].optimizer == 3 * parameters
    assert memory[1].gradients == 2 * parameters and memory[2].gradients == parameters / 2
    assert memory[2].weights == 2 * parameters and memory[3].weights == parameters / 2


def test_recompute_and_sequence_parallelism_shrink_activations_and_the_first_stage_holds_the_most_in_flight():
    bf16 = TrainingSettings(global_batch_size=16)
    def memory(**change):
        return estimate_memory(SHAPE, Layout(**{"tensor": 2, "pipeline": 1, "data": 1, "zero_stage": 1,
                                                "micro_batch": 2, "recompute": False, "sequence_parallel": False,
                                                **change}), bf16)
    assert memory(recompute=True).activations < memory(sequence_parallel=True).activations < memory().activations
    pipelined = memory(pipeline=4, tensor=1)
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


def test_from_flags_reads_a_pretrain_command_line():
    from megatron.config.arguments import parse_args, validate_args
    flags = validate_args(parse_args(["--model-size", "1.3B", "--tokenizer-type", "NullTokenizer", "--vocab-size",
                                      "50257", "--mock-data", "--bf16", "--sequence-parallel"]), 8, "cuda")
    shape, layout, settings = from_flags(flags, 50257)
    assert (shape.num_layers, shape.hidden_size, shape.padded_vocab(2)) == (24, 2048, 50432)
    assert settings.dtype == "bf16" and layout == Layout(2, 2, 2, 1, 8, True, True)


def test_plan_layout_tool_table_and_json(capsys):
    from tools.plan_layout import main
    assert main(["--model-size", "1.3B", "--devices", "8", "--device-memory", "24", "--top", "5"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert "fit in 24 GiB" in table[0] and table[1].startswith("| TP | PP | DP | ZeRO | mbs |") and len(table) == 8
    assert all(row.split(" | ")[-3] == "yes" for row in table[3:])
    main(["--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
          "--global-batch-size", "8", "--vocab-size", "200", "--devices", "2", "--device-memory", "1", "--json"])
    plans = json.loads(capsys.readouterr().out)["plans"]
    assert plans and all(plan["fits"] for plan in plans)
    assert {plan["layout"]["tensor"] for plan in plans} == {1, 2}
    with pytest.raises(InputError, match="--num-layers is needed without --model-size"):
        main(["--devices", "8", "--device-memory", "80"])
    with pytest.raises(InputError, match="does not model mixture-of-experts"):
        main(["--model-size", "125M_MoE64", "--devices", "8", "--device-memory", "80"])
