"""The GPT tensor-parallel plan as data, in this process: which style each module path gets, the partition dim
of every parameter name, and that every pattern of the plan still names modules of the model (the plan's
application on real ranks is checked in test_model_parallel_parity.py and test_pipeline.py)."""
from dataclasses import replace

import torch

from megatron.model.gpt import GPTConfig, GPTModel
from megatron.model.parallelize import GPT_TENSOR_PARALLEL_PLAN, tensor_parallel_partition_dim
from megatron.tensor_parallel.plan import ColumnParallel, RowParallel, SequenceParallel, Split, style_for

CONFIG = GPTConfig(vocab_size=64, max_position_embeddings=16, num_layers=3, hidden_size=16, num_attention_heads=2)


def test_partition_dims_of_the_gpt_parameters():
    dims = {"embedding.word_embeddings.weight": 0, "embedding.position_embeddings.weight": None,
            "layers.11.input_layernorm.weight": None, "layers.11.self_attention.query_key_value.weight": 0,
            "layers.11.self_attention.query_key_value.bias": 0, "layers.11.self_attention.dense.weight": 1,
            "layers.11.self_attention.dense.bias": None, "layers.11.post_attention_layernorm.bias": None,
            "layers.11.mlp.dense_h_to_4h.weight": 0, "layers.11.mlp.dense_h_to_4h.bias": 0,
            "layers.11.mlp.dense_4h_to_h.weight": 1, "layers.11.mlp.dense_4h_to_h.bias": None,
            "final_layernorm.weight": None, "final_layernorm.bias": None}
    assert {name: tensor_parallel_partition_dim(name) for name in dims} == {
        name: None if dim is None else Split(dim) for name, dim in dims.items()}


def test_a_swiglu_mlps_gate_and_up_rows_are_split_half_by_half():
    """[gate; up] rows: a rank holds [gate_r; up_r] (upstream Megatron-DeepSpeed main's per-rank order); the rest
    of the plan is unchanged, experts and PR-MoE's dense MLP included."""
    from megatron.tensor_parallel import shard_of
    assert tensor_parallel_partition_dim("layers.3.mlp.dense_h_to_4h.weight", swiglu=True) == Split(0, 2)
    assert tensor_parallel_partition_dim("layers.3.mlp.dense_4h_to_h.weight", swiglu=True) == Split(1)
    assert tensor_parallel_partition_dim("layers.1.mlp.mlp.dense_h_to_4h.bias", True, True) == Split(0, 2)
    gate, up = torch.arange(8).reshape(8, 1) * 10, torch.arange(8).reshape(8, 1) * 10 + 1
    full = torch.cat((gate, up))
    assert [shard_of(full, 0, rank, 4, blocks=2).flatten().tolist() for rank in range(4)] == [
        [0, 10, 1, 11], [20, 30, 21, 31], [40, 50, 41, 51], [60, 70, 61, 71]]


def test_pr_moes_dense_mlp_is_split_only_with_the_experts():
    # as upstream's ParallelMLP(moe=True) copy beside the experts: tensor-parallel only with
    # --enable-expert-tensor-parallelism; the mixing coefficient stays whole
    dims = {"layers.1.mlp.mlp.dense_h_to_4h.weight": 0, "layers.1.mlp.mlp.dense_h_to_4h.bias": 0,
            "layers.1.mlp.mlp.dense_4h_to_h.weight": 1, "layers.1.mlp.mlp.dense_4h_to_h.bias": None,
            "layers.1.mlp.coefficient.weight": None}
    assert {name: tensor_parallel_partition_dim(name, experts=True) for name in dims} == {
        name: None if dim is None else Split(dim) for name, dim in dims.items()}
    assert all(tensor_parallel_partition_dim(name) is None for name in dims)


def test_a_star_stands_for_exactly_one_path_component():
    assert isinstance(style_for(GPT_TENSOR_PARALLEL_PLAN, "layers.0.self_attention.query_key_value"), ColumnParallel)
    assert isinstance(style_for(GPT_TENSOR_PARALLEL_PLAN, "layers.7.mlp.dense_4h_to_h"), RowParallel)
    assert isinstance(style_for(GPT_TENSOR_PARALLEL_PLAN, "final_layernorm"), SequenceParallel)
    for path in ("layers.self_attention.dense", "layers.1.2.self_attention.dense", "self_attention.dense",
                 "layers.1.self_attention.dense.weight", "embedding.final_layernorm"):
        assert style_for(GPT_TENSOR_PARALLEL_PLAN, path) is None, path


def test_every_pattern_of_the_plan_names_modules_of_the_model():
    model = GPTModel(replace(CONFIG, qk_layernorm=True))
    paths = [path for path, _ in model.named_modules()]
    for pattern, style in GPT_TENSOR_PARALLEL_PLAN.items():
        matched = [path for path in paths if style_for({pattern: style}, path) is not None]
        assert matched, pattern
        assert all(isinstance(model.get_submodule(path), style.expected_type) for path in matched), pattern
    for name, parameter in model.named_parameters():  # a split dim is one the parameter has
        split = tensor_parallel_partition_dim(name)
        assert split is None or split.dim < parameter.dim(), name
