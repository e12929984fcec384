"""Rank layout arithmetic (against hand-written tables and DeepSpeed's topology), the process groups a
ParallelState really creates on 4 processes, and the mpu interface DeepSpeed reads from it."""
import pytest
import torch
import torch.distributed as dist

from tests.helpers.distributed import run_on_ranks
from megatron.errors import InputError
from megatron.parallel_state import ParallelState, RankLayout

pytestmark = pytest.mark.full  # multi-process / whole-run tests: the full tier


def test_layout_tp2_pp2_dp2_by_hand():
    layout = RankLayout.for_world(8, tensor_parallel_size=2, pipeline_parallel_size=2)
    assert (layout.tensor, layout.data, layout.pipeline) == (2, 2, 2)
    assert layout.groups("tensor") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert layout.groups("data") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert layout.groups("pipeline") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert layout.groups("model") == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert layout.coordinates(5) == {"pipeline": 1, "data": 0, "sequence": 0, "tensor": 1}  # 5 = 1 * 4 + 0 * 2 + 1
    assert layout.coordinates(6) == {"pipeline": 1, "data": 1, "sequence": 0, "tensor": 0}
    assert all(layout.global_rank(**layout.coordinates(rank)) == rank for rank in range(8))


def test_layout_with_ulysses_sequence_parallel_by_hand():
    """Sequence-parallel ranks sit between tensor and data (upstream main's order at TP = PP = 1)."""
    layout = RankLayout.for_world(8, tensor_parallel_size=1, pipeline_parallel_size=1, sequence_parallel_size=2)
    assert (layout.data, layout.sequence) == (4, 2)
    assert layout.groups("sequence") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert layout.groups("data") == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert layout.groups("sequence_data") == [list(range(8))]
    assert layout.groups("model") == [[rank] for rank in range(8)]
    assert [layout.coordinates(rank)["sequence"] for rank in range(4)] == [0, 1, 0, 1]
    layout = RankLayout.for_world(8, tensor_parallel_size=2, pipeline_parallel_size=1, sequence_parallel_size=2)
    assert layout.groups("sequence") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert layout.groups("data") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert layout.groups("sequence_data") == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert all(layout.global_rank(**layout.coordinates(rank)) == rank for rank in range(8))
    with pytest.raises(InputError, match="x --ds-sequence-parallel-size 3 = 3 does not divide"):
        RankLayout.for_world(8, 1, 1, 3)


@pytest.mark.parametrize("world, tp, pp", [(8, 2, 2), (8, 4, 1), (8, 1, 4), (12, 2, 3)])
def test_layout_equals_deepspeed_topology(world, tp, pp):
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology
    layout = RankLayout.for_world(world, tp, pp)
    topology = PipeModelDataParallelTopology(num_pp=pp, num_mp=tp, num_dp=layout.data)
    for rank in range(world):
        coord = topology.get_coord(rank)
        assert layout.coordinates(rank) == {"pipeline": coord.pipe, "data": coord.data, "sequence": 0,
                                            "tensor": coord.model}
    assert sorted(layout.groups("tensor")) == sorted(topology.get_axis_comm_lists("model"))
    assert sorted(layout.groups("data")) == sorted(topology.get_axis_comm_lists("data"))
    assert sorted(layout.groups("pipeline")) == sorted(topology.get_axis_comm_lists("pipe"))


@pytest.mark.parametrize("tp, pp, message", [
    (3, 1, "--tensor-model-parallel-size 3 x --pipeline-model-parallel-size 1 = 3 does not divide the number "
           "of processes 8"),
    (2, 3, "--tensor-model-parallel-size 2 x --pipeline-model-parallel-size 3 = 6 does not divide"),
    (0, 1, "--tensor-model-parallel-size is 0; it must be a positive integer"),
    (1, -2, "--pipeline-model-parallel-size is -2; it must be a positive integer"),
])
def test_invalid_sizes_name_the_flags(tp, pp, message):
    with pytest.raises(InputError, match=message.replace("(", r"\(")):
        RankLayout.for_world(8, tp, pp)


def members(group):
    """The global ranks in `group`, found by communicating over it (not by asking our own bookkeeping)."""
    flags = torch.zeros(dist.get_world_size())
    flags[dist.get_rank()] = 1.0
    dist.all_reduce(flags, group=group)
    return flags.nonzero().flatten().tolist()


def groups_on_four_ranks():
    from deepspeed.utils import bwc
    results = {}
    for tp, pp in ((2, 2), (2, 1), (1, 2)):
        state = ParallelState(tp, pp)
        results[(tp, pp)] = {
            "tensor": members(state.get_tensor_model_parallel_group()),
            "data": members(state.get_data_parallel_group()),
            "pipeline": members(state.get_pipeline_model_parallel_group()),
            "model": members(state.get_model_parallel_group()),
            "ranks": (state.get_tensor_model_parallel_rank(), state.get_data_parallel_rank(),
                      state.get_pipeline_model_parallel_rank(), state.get_model_parallel_rank()),
            "sizes": (state.get_tensor_model_parallel_world_size(), state.get_data_parallel_world_size(),
                      state.get_pipeline_model_parallel_world_size(), state.get_model_parallel_world_size()),
            "tensor_src": state.get_tensor_model_parallel_src_rank(),
            "data_ranks": state.get_data_parallel_group_ranks(),
            "stages": (state.is_pipeline_first_stage(), state.is_pipeline_last_stage()),
            # What DeepSpeed's backward-compatible helpers read from an mpu.
            "deepspeed_view": (bwc.bwc_tensor_model_parallel_rank(state),
                               bwc.bwc_tensor_model_parallel_world_size(state),
                               bwc.bwc_pipeline_parallel_world_size(state),
                               members(bwc.bwc_tensor_model_parallel_group(state)),
                               members(bwc.bwc_pipeline_parallel_group(state))),
            "deepspeed_names": (state.get_slice_parallel_rank(), state.get_pipe_parallel_world_size(),
                                state.get_sequence_parallel_world_size()),
        }
    ulysses = ParallelState(1, 1, sequence_parallel_size=2)
    results["ulysses"] = (members(ulysses.get_sequence_parallel_group()), members(ulysses.get_data_parallel_group()),
                          members(ulysses.get_sequence_data_parallel_group()),
                          members(ulysses.get_model_parallel_group()),
                          (ulysses.get_sequence_parallel_rank(), ulysses.get_sequence_parallel_world_size(),
                           ulysses.get_sequence_data_parallel_rank(), ulysses.get_sequence_data_parallel_world_size(),
                           ulysses.get_data_parallel_world_size()))
    try:
        ParallelState(3, 1)
    except InputError as error:
        results["error"] = str(error)
    results["ulysses_hook_absent"] = not hasattr(ParallelState, "initialize_sequence_parallel")
    return results


@pytest.fixture(scope="module")
def four_ranks():
    return run_on_ranks(groups_on_four_ranks, 4)


# (tp, pp) -> per rank: tensor group, data group, pipeline group, model group, (tp, dp, pp, mp) ranks
EXPECTED = {
    (2, 2): [([0, 1], [0], [0, 2], [0, 1, 2, 3], (0, 0, 0, 0)), ([0, 1], [1], [1, 3], [0, 1, 2, 3], (1, 0, 0, 1)),
             ([2, 3], [2], [0, 2], [0, 1, 2, 3], (0, 0, 1, 2)), ([2, 3], [3], [1, 3], [0, 1, 2, 3], (1, 0, 1, 3))],
    (2, 1): [([0, 1], [0, 2], [0], [0, 1], (0, 0, 0, 0)), ([0, 1], [1, 3], [1], [0, 1], (1, 0, 0, 1)),
             ([2, 3], [0, 2], [2], [2, 3], (0, 1, 0, 0)), ([2, 3], [1, 3], [3], [2, 3], (1, 1, 0, 1))],
    (1, 2): [([0], [0, 1], [0, 2], [0, 2], (0, 0, 0, 0)), ([1], [0, 1], [1, 3], [1, 3], (0, 1, 0, 0)),
             ([2], [2, 3], [0, 2], [0, 2], (0, 0, 1, 1)), ([3], [2, 3], [1, 3], [1, 3], (0, 1, 1, 1))],
}


@pytest.mark.parametrize("sizes", sorted(EXPECTED))
def test_groups_really_connect_the_expected_ranks(four_ranks, sizes):
    tp, pp = sizes
    for rank, (tensor, data, pipeline, model, ranks) in enumerate(EXPECTED[sizes]):
        got = four_ranks[rank][sizes]
        assert (got["tensor"], got["data"], got["pipeline"], got["model"]) == (tensor, data, pipeline, model), rank
        assert got["ranks"] == ranks, rank
        assert got["sizes"] == (tp, 4 // (tp * pp), pp, tp * pp)
        assert got["tensor_src"] == tensor[0]
        assert got["data_ranks"] == data
        assert got["stages"] == (ranks[2] == 0, ranks[2] == pp - 1)
        assert got["deepspeed_view"] == (ranks[0], tp, pp, tensor, pipeline)
        assert got["deepspeed_names"] == (ranks[0], pp, 1)


def test_ulysses_groups_are_those_deepspeed_reduces_over(four_ranks):
    """SP 2 x DP 2: gradients are reduced over all four ranks, the data-parallel group pairs equal chunks."""
    for rank, result in enumerate(four_ranks):
        pair = [rank - rank % 2, rank - rank % 2 + 1]
        assert result["ulysses"] == (pair, [rank % 2, rank % 2 + 2], [0, 1, 2, 3], [rank], (rank % 2, 2, rank, 4, 2))


def test_invalid_sizes_fail_on_every_rank_before_any_group_is_made(four_ranks):
    for result in four_ranks:
        assert "--tensor-model-parallel-size 3 x --pipeline-model-parallel-size 1 = 3 does not divide the number " \
               "of processes 4" in result["error"]
        assert result["ulysses_hook_absent"]


def test_needs_an_initialized_process_group():
    with pytest.raises(RuntimeError, match="torch.distributed to be initialized"):
        ParallelState(1, 1)
