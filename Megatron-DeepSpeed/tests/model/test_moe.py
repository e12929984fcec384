"""Mixture of experts on DeepSpeed's MoE layer (megatron/model/moe.py): expert parallelism reproduces the
single-process run, capacity drops are counted, PR-MoE and top-2 resume exactly, and upstream's MoE flag sets
pass (checkpoint conversion and Adam state: tests/checkpoint/reshape/test_moe_conversion.py). Real processes over gloo; parity with
one process is the oracle."""
import pytest
import torch
from tests.helpers.distributed import run_on_ranks
from tests.helpers.moe import COMMON, ITERATIONS, skewed_model, train_moe, validated

from megatron.model.moe import is_expert_parameter


@pytest.fixture(scope="module")
def single_process(data_prefix):
    return run_on_ranks(train_moe, 1, [*COMMON, "--data-path", data_prefix])[0]


@pytest.mark.full
@pytest.mark.parametrize("zero_stage", ["0", "2"])
def test_expert_parallel_training_equals_single_process(zero_stage, data_prefix, single_process):
    # EP 2 x DP 2; under ZeRO 2 the experts' own parameter groups are partitioned over their expert-data ranks.
    losses, dense, norm = run_on_ranks(train_moe, 4, [*COMMON, "--data-path", data_prefix, "--zero-stage",
                                                      zero_stage, "--moe-expert-parallel-size", "2"])[0]
    reference_losses, reference_dense, reference_norm = single_process
    assert losses == pytest.approx(reference_losses, rel=1e-5)
    assert norm == pytest.approx(reference_norm, rel=1e-5)
    assert reference_losses[-1] < reference_losses[0]
    for name, tensor in dense.items():
        torch.testing.assert_close(tensor, reference_dense[name], rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.full
def test_tensor_and_expert_parallel_training_equals_single_process(data_prefix, single_process):
    # TP 2 x EP 2 (DP 2): the dense part is tensor-parallel and each MoE layer drops the duplicate tokens of the
    # TP ranks before its all-to-all and gathers them after. That gather needs nccl's flat all_gather_into_tensor,
    # which tests/helpers/flat_gather_backend.py gives these CPU ranks; the losses are still the single process's.
    from tests.helpers.flat_gather_backend import BACKEND
    losses, _, norm = run_on_ranks(train_moe, 4, [*COMMON, "--data-path", data_prefix,
                                                  "--tensor-model-parallel-size", "2",
                                                  "--moe-expert-parallel-size", "2"], backend=BACKEND)[0]
    reference_losses, _, reference_norm = single_process
    assert losses == pytest.approx(reference_losses, rel=1e-5)
    assert norm == pytest.approx(reference_norm, rel=1e-5)


@pytest.mark.full
def test_experts_split_over_tensor_parallel_ranks_train_resume_and_convert_as_one_process(data_prefix, tmp_path):
    # PR-MoE, TP 2 x EP 2 with --enable-expert-tensor-parallelism: DeepSpeed's expert-parallel groups lie across the
    # data-parallel ranks ([0, 2], [1, 3]), each expert and the dense MLP beside them is a column- then row-parallel
    # MLP, and the MoE layer gathers the tokens over the tensor-parallel ranks before the experts and drops them
    # after. Same losses and weight norm as one process; the iteration-2 checkpoint (each tensor-parallel rank's
    # expert shards in its own mp_rank file, its dense MLP shards in its model-states file) reads as the one
    # process's model, resumes exactly, and its weights converted to TP 1 x EP 1 give the next loss in one process.
    from tests.helpers.flat_gather_backend import BACKEND

    from megatron.checkpoint.reshape.conversions import reshape
    from megatron.checkpoint.torch_files import load_file
    from megatron.checkpoint.parameter_names import upstream_expert_key
    from megatron.checkpoint.formats.plain_engine import module_names
    from megatron.checkpoint.formats.reader import read_checkpoint
    from megatron.checkpoint.formats.weight_units import TensorShard
    from megatron.checkpoint.reshape.target_writer import TargetLayout
    # DeepSpeed splits the capacity over the tensor-parallel ranks, and without token dropping its gate leaves an
    # odd capacity then (refused in flags/moe.py); capacity factor 4 = experts gives each expert room for every
    # token, so none is dropped, as in the reference run.
    residual = [*COMMON, "--data-path", data_prefix, "--mlp-type", "residual"]
    flags = [*residual, "--tensor-model-parallel-size", "2", "--moe-expert-parallel-size", "2",
             "--enable-expert-tensor-parallelism", "--moe-train-capacity-factor", "4"]
    flags.remove("--disable-moe-token-dropping")
    reference_losses, _, reference_norm = run_on_ranks(
        train_moe, 1, [*residual, "--save", str(tmp_path / "one"), "--save-interval", "2"])[0]
    losses, _, norm = run_on_ranks(train_moe, 4, [*flags, "--save", str(tmp_path / "tp2"), "--save-interval", "2"],
                                   backend=BACKEND)[0]
    assert losses == pytest.approx(reference_losses, rel=1e-5)
    assert norm == pytest.approx(reference_norm, rel=1e-5)
    one, read = (read_checkpoint(str(tmp_path / name), iteration=2).model for name in ("one", "tp2"))
    assert read.keys() == one.keys()
    for name in one:  # the dense MLP beside the experts joined whole, as the one process holds it
        torch.testing.assert_close(read[name], one[name], rtol=1e-4, atol=1e-5, msg=name)
    residual_weight = "layers.1.mlp.mlp.dense_4h_to_h.weight"
    residual_halves = [module_names(load_file(str(tmp_path / "tp2" / "global_step2" /
                                                  f"mp_rank_{tp:02d}_model_states.pt"))["module"])[residual_weight]
                       for tp in (0, 1)]
    assert residual_halves[0].shape == (32, 64)  # ffn 128 split by columns (row-parallel), as upstream's
    torch.testing.assert_close(read[residual_weight], torch.cat(residual_halves, dim=1))
    # a TP 2 target's part (generation's) holds it whole, as its model does, beside its half of the dense MLPs
    second = read_checkpoint(str(tmp_path / "tp2"), iteration=2, part=TensorShard(1, 2)).model
    assert torch.equal(second[residual_weight], read[residual_weight])
    attention = "layers.1.self_attention.dense.weight"
    assert torch.equal(second[attention], read[attention][:, 16:])
    shard = "layers.1.mlp.deepspeed_moe.experts.deepspeed_experts.3.dense_h_to_4h.weight"
    tag_dir = tmp_path / "tp2" / "global_step2"
    halves = [load_file(str(tag_dir / f"layer_0_expert_3_mp_rank_{tp:02d}_model_states.pt"))[shard] for tp in (0, 1)]
    assert halves[0].shape == (64, 32) and not torch.equal(halves[0], halves[1])  # ffn 128 split by rows
    torch.testing.assert_close(read[shard], torch.cat(halves))
    from megatron.hf.examine import examine  # what tools/inspect_checkpoint.py prints first
    header = examine(str(tmp_path / "tp2")).header[-1]
    assert header.endswith("--moe-expert-parallel-size 2 --enable-expert-tensor-parallelism")
    (tmp_path / "tp2" / "latest").write_text("global_step2")
    resumed = run_on_ranks(train_moe, 4, [*flags, "--load", str(tmp_path / "tp2")], backend=BACKEND)[0]
    assert resumed[0] == losses[2:] and resumed[2] == norm
    reshape(str(tmp_path / "tp2"), str(tmp_path / "tp1"), TargetLayout(1, 1, pipeline_engine=False), iteration=2,
            weights_only=True)  # Adam state of MoE sources with TP > 1 is refused (convert.check_expert_target)
    converted = run_on_ranks(train_moe, 1, [*residual, "--load", str(tmp_path / "tp1"), "--no-load-optim"])[0]
    assert converted[0][0] == pytest.approx(losses[2], rel=1e-5)
    # Converted to TP 2 x EP 1, each rank's expert files hold its halves again (the flag is recorded), same model,
    # under upstream's module path.
    reshape(str(tmp_path / "tp2"), str(tmp_path / "ep1"), TargetLayout(2, 1, pipeline_engine=False), iteration=2,
            weights_only=True)
    assert torch.equal(load_file(str(tmp_path / "ep1" / "global_step2" / "layer_0_expert_3_mp_rank_01_model_states.pt"))
                       [upstream_expert_key(shard)], halves[1])
    assert torch.equal(module_names(load_file(str(tmp_path / "ep1" / "global_step2" / "mp_rank_01_model_states.pt"))
                                    ["module"])[residual_weight], residual_halves[1])
    source, target = (read_checkpoint(str(tmp_path / name), iteration=2).model for name in ("tp2", "ep1"))
    assert source.keys() == target.keys() and all(torch.equal(source[name], target[name]) for name in source)


def gather_like_deepspeeds_moe_then_train(argv):
    """What gloo says to the gather DeepSpeed's MoE layer makes over tensor-parallel ranks (a flat output for a
    3-D input, deepspeed/moe/mappings.py:39-40) and to the same gather into the inputs stacked on dim 0; then
    pretrain()'s refusal of tensor parallelism with experts."""
    import deepspeed.comm
    import torch.distributed as dist

    from megatron.errors import InputError
    from megatron.model.provider import model_provider
    from megatron.training.loop import pretrain

    deepspeed.comm.init_distributed("gloo")
    expert_output = torch.full((4, 2, 8), float(dist.get_rank()))  # experts x capacity slots x hidden
    stacked = torch.empty(2 * 4, 2, 8)
    deepspeed.comm.all_gather_into_tensor(stacked, expert_output)
    try:
        deepspeed.comm.all_gather_into_tensor(torch.empty(2 * expert_output.numel()), expert_output)
        flat = "accepted"
    except RuntimeError as error:
        flat = str(error)
    try:
        pretrain(model_provider, argv)
        refusal = None
    except InputError as error:
        refusal = str(error)
    return stacked[4:].eq(1).all().item(), flat, refusal


@pytest.mark.full
def test_tensor_parallel_experts_over_gloo_are_refused_naming_deepspeeds_flat_gather(data_prefix):
    # Gloo gathers into an output shaped as the inputs stacked on dim 0 but refuses DeepSpeed's flat buffer for a
    # multi-dimensional input; every MoE forward at TP > 1 makes that gather (sharded_moe.py:742), so TP with
    # experts is refused over gloo. Should a later torch accept the flat buffer, this fails: lift the refusal.
    stacked_ok, flat, refusal = run_on_ranks(gather_like_deepspeeds_moe_then_train, 2, [
        *COMMON, "--data-path", data_prefix, "--tensor-model-parallel-size", "2",
        "--moe-expert-parallel-size", "2"])[0]
    assert stacked_ok
    assert "ProcessGroupGloo::allgather: invalid tensor size" in flat
    assert refusal.startswith("--tensor-model-parallel-size 2 with --num-experts above 1 over gloo:")
    assert "deepspeed/moe/mappings.py:39-40" in refusal and "\n" not in refusal


# --- flags ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("extra, message", [
    (["--num-experts", "4"], "add --no-pipeline-parallel"),
    (["--num-experts", "4", "2", "2", "--no-pipeline-parallel"], "give one, or one per MoE layer: --num-layers 4 "
                                                                 "/ --expert-interval 2 = 2"),
    (["--num-experts", "6", "--no-pipeline-parallel", "--moe-expert-parallel-size", "4"],
     "--num-experts 6 is not divisible by --moe-expert-parallel-size 4"),
    (["--num-experts", "8", "--no-pipeline-parallel", "--moe-expert-parallel-size", "8"],
     "world size 4 is not divisible by --moe-expert-parallel-size 8"),
    (["--num-experts", "4", "--no-pipeline-parallel", "--zero-stage", "3"], "use --zero-stage 2 or lower"),
    (["--num-experts", "4", "--no-pipeline-parallel", "--enable-expert-tensor-parallelism",
      "--tensor-model-parallel-size", "2", "--moe-expert-parallel-size", "4"],
     "the data-parallel size 2 is not divisible by --moe-expert-parallel-size 4; with "
     "--enable-expert-tensor-parallelism"),
    (["--num-experts", "4", "--no-pipeline-parallel", "--enable-expert-tensor-parallelism",
      "--tensor-model-parallel-size", "2", "--disable-moe-token-dropping"],
     "deepspeed/moe/sharded_moe.py:253) then leaves the capacity unpadded"),
    (["--num-experts", "4", "--no-pipeline-parallel", "--moe-train-capacity-factor", "0"], "must be greater than 0"),
])
def test_moe_flags_are_checked_with_one_line(extra, message):
    from megatron.errors import InputError
    with pytest.raises(InputError) as caught:
        validated(*extra)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_moe_layers_follow_upstreams_expert_interval_and_per_layer_counts():
    from megatron.config.arguments import job_config
    pyramid = job_config(validated("--num-experts", "2", "4", "--no-pipeline-parallel", "--mlp-type", "residual",
                                   "--topk", "2", "--moe-expert-parallel-size", "2")).moe
    assert [pyramid.experts_of_layer(n) for n in (1, 2, 3, 4)] == [1, 2, 1, 4]
    assert (pyramid.mlp_type, pyramid.topk, pyramid.enabled) == ("residual", 2, True)
    every = job_config(validated("--num-experts", "4", "--expert-interval", "1", "--no-pipeline-parallel")).moe
    assert [every.experts_of_layer(n) for n in (1, 2, 3, 4)] == [4, 4, 4, 4]
    assert not job_config(validated()).moe.enabled


# --- capacity and dropping (one process, no engine) ---------------------------------------------------------

def test_a_skewed_router_at_capacity_factor_one_drops_the_overflow_and_counts_it():
    model = skewed_model()
    tokens = torch.randint(0, 200, (2, 32))
    model(tokens, labels=tokens)
    # 64 tokens, 4 experts: capacity ceil(64 / 4 x 1.0) = 16 slots of expert 0; the other 48 are dropped.
    lm, moe, dropped, forwards = model.take_loss_sums()
    assert (dropped.item(), forwards) == (48, 1)
    assert moe.item() == pytest.approx(0.1 * 4 * 1.0 * 0.25)  # coeff x E x mean gate (1/4) x share of expert 0 (1)
    assert model.take_loss_sums()[3] == 0  # the sums restart


def test_disabling_token_dropping_drops_none():
    model = skewed_model("--disable-moe-token-dropping")
    tokens = torch.randint(0, 200, (2, 32))
    model(tokens, labels=tokens)
    assert model.take_loss_sums()[2].item() == 0


def test_the_iteration_line_carries_upstreams_moe_loss_and_our_dropped_tokens():
    from megatron.training.log_lines import iteration_line, parse_log
    line = iteration_line(3, 10, 12, 5.0, 1e-3, 4, 2.5, 1.0, 0.5, 0, 0, 8.0, 0.0, moe_loss=0.0125, dropped_tokens=48)
    assert " lm loss: 2.500000E+00 | moe loss: 1.250000E-02 | dropped tokens: 48 | loss scale: 1.0 |" in line
    record = parse_log(line).iterations[0]
    assert (record.moe_loss, record.dropped_tokens) == (0.0125, 48)


# --- checkpoints ---------------------------------------------------------------------------------------------

@pytest.mark.full
def test_pr_moe_with_top2_trains_and_resumes_exactly_at_ep2_zero1(data_prefix, tmp_path):
    # PR-MoE (dense MLP + experts), top-2 with its sampled second expert, tokens dropped at capacity, ZeRO 1 with
    # the experts' own parameter groups: the run from the iteration-2 checkpoint repeats iterations 3 and 4.
    flags = [*COMMON, "--data-path", data_prefix, "--mlp-type", "residual", "--topk", "2", "--zero-stage", "1",
             "--moe-expert-parallel-size", "2", "--moe-min-capacity", "4", "--create-moe-param-group"]
    flags.remove("--disable-moe-token-dropping")
    straight = run_on_ranks(train_moe, 4, [*flags, "--save", str(tmp_path), "--save-interval", "2"])[0]
    assert {f"layer_0_expert_{e}_mp_rank_00_model_states.pt" for e in range(4)} <= \
        {path.name for path in (tmp_path / "global_step2").iterdir()}
    # The reader gathers every expert of the EP2 checkpoint under the single-process model's names.
    from megatron.checkpoint.formats.reader import read_checkpoint
    experts = {name for name in read_checkpoint(str(tmp_path), iteration=2).model if is_expert_parameter(name)}
    assert experts == {f"layers.1.mlp.deepspeed_moe.experts.deepspeed_experts.{e}.{linear}.{kind}"
                       for e in range(4) for linear in ("dense_h_to_4h", "dense_4h_to_h") for kind in ("weight", "bias")}
    (tmp_path / "latest").write_text("global_step2")
    resumed = run_on_ranks(train_moe, 4, [*flags, "--load", str(tmp_path)])[0]
    assert resumed[0] == straight[0][2:] and resumed[2] == straight[2]
    for name, tensor in resumed[1].items():
        torch.testing.assert_close(tensor, straight[1][name], rtol=0, atol=0, msg=name)


# --- upstream's MoE scripts (b4d4a0e examples/MoE/), flags exactly as their shell expands them ---------------

UPSTREAM_MOE_FLAGS = """--override-lr-scheduler --adam-beta1 0.9 --adam-beta2 0.95 --tensor-model-parallel-size 1
    --moe-expert-parallel-size {ep} --num-experts {experts} --moe-loss-coeff 0.01 --moe-train-capacity-factor 1.0
    --moe-eval-capacity-factor 1.0 --moe-min-capacity 4 --init-method-std 0.014 --lr-decay-tokens 300000000000
    --lr-warmup-tokens 375000000 --micro-batch-size {mbs} --exit-duration-in-mins 30000000 --global-batch-size {gbs}
    --num-layers {layers} --hidden-size {hidden} --num-attention-heads {heads} --seq-length 2048
    --max-position-embeddings 2048 --train-tokens 300000000000 --train-iters {iters} --lr {lr} --min-lr {min_lr}
    --lr-decay-style cosine --split 98,2,0 --log-interval 10 --eval-interval 100 --eval-iters 10
    --save-interval 10000 --weight-decay 0.1 --clip-grad 1.0 --hysteresis 2 --num-workers 0 --fp16
    --load {out}/ckpt --save {out}/ckpt --tensorboard-queue-size 1 --log-timers-to-tensorboard
    --log-batch-size-to-tensorboard --log-validation-ppl-to-tensorboard --tensorboard-dir {out}/tb
    --checkpoint-activations --create-moe-param-group --vocab-file {vocab} --merge-file {merges}
    --data-path {data} --data-impl mmap --deepspeed --deepspeed_config {out}/ds_config.json
    --pipeline-model-parallel-size 1 --no-pipeline-parallel --deepspeed-activation-checkpointing"""
# ds_config_gpt_TEMPLATE.json as the scripts' sed fills it (ZeRO 0, fp16 on, curriculum learning off).
UPSTREAM_MOE_JSON = """{{"train_batch_size": {gbs}, "train_micro_batch_size_per_gpu": {mbs}, "steps_per_print": 10,
    "zero_optimization": {{"stage": 0, "elastic_checkpoint": true}}, "gradient_clipping": 1.0,
    "prescale_gradients": true, "fp16": {{"enabled": true, "loss_scale": 0, "loss_scale_window": 500,
    "hysteresis": 2, "min_loss_scale": 1, "initial_scale_power": 11}}, "bf16": {{"enabled": false}},
    "curriculum_learning": {{"enabled": false, "curriculum_type": "seqlen", "min_difficulty": 80,
    "max_difficulty": 2048, "schedule_type": "fixed_linear", "schedule_config": {{"total_curriculum_step": 29605,
    "difficulty_step": 8}}}}, "wall_clock_breakdown": false}}"""
# ds_pretrain_gpt_125M_MoE64.sh on 8 GPUs (EP_PARALLEL_SIZE = NUM_GPUS = 8); ds_pretrain_gpt_1.3B_MoE128.sh on
# its NUM_GPUS=64 (EP_PARALLEL_SIZE 64).
UPSTREAM_MOE_SCRIPTS = {
    "125M_MoE64": (8, dict(ep=8, experts=64, mbs=4, gbs=256, layers=12, hidden=768, heads=12, iters=1716613,
                           lr=4.5e-4, min_lr=4.5e-06)),
    "1.3B_MoE128": (64, dict(ep=64, experts=128, mbs=8, gbs=512, layers=24, hidden=2048, heads=16, iters=858306,
                             lr=1.2e-4, min_lr=1.0e-6)),
}


@pytest.mark.parametrize("name", list(UPSTREAM_MOE_SCRIPTS))
def test_upstream_moe_scripts_pass_the_argument_checks_unchanged(name, tmp_path):
    from megatron.config.arguments import job_config, parse_args, validate_args
    world_size, sizes = UPSTREAM_MOE_SCRIPTS[name]
    for file in ("vocab.json", "merges.txt"):
        (tmp_path / file).write_text("{}")
    (tmp_path / "ds_config.json").write_text(UPSTREAM_MOE_JSON.format(**sizes))
    argv = UPSTREAM_MOE_FLAGS.format(out=tmp_path, vocab=tmp_path / "vocab.json", merges=tmp_path / "merges.txt",
                                     data=tmp_path / "data", **sizes).split()
    config = job_config(validate_args(parse_args(argv), world_size, "cuda"))
    assert config.moe.enabled and config.moe.num_experts == (sizes["experts"],)
    assert [config.moe.experts_of_layer(n) for n in (1, 2)] == [1, sizes["experts"]]
    assert (config.moe.expert_parallel_size, config.moe.loss_coeff, config.parallel.zero_stage) == (sizes["ep"], 0.01, 0)


def train_moe_whole(argv):
    """pretrain() in one process; its full state dict (every expert) and the validation loss."""
    from megatron.model.provider import model_provider
    from megatron.training.loop import pretrain
    result = pretrain(model_provider, argv)
    return {name: tensor.detach().clone() for name, tensor in result.model.state_dict().items()}, \
        result.validation_loss


@pytest.mark.full
def test_moe_checkpoint_is_read_generated_from_and_evaluated_and_refused_by_hf_and_the_pipeline_engine(data_prefix, tmp_path):
    from megatron.hf.conversions import export_hf
    from megatron.checkpoint.reshape.conversions import reshape
    from megatron.checkpoint.formats.reader import read_checkpoint
    from megatron.checkpoint.reshape.target_writer import TargetLayout
    from megatron.errors import InputError
    from megatron.inference.loading import load_model
    from megatron.model.kernels import PORTABLE_KERNELS
    flags = [*COMMON, "--data-path", data_prefix, "--mlp-type", "residual", "--split", "80,20,0"]
    trained, _ = run_on_ranks(train_moe_whole, 1, [*flags, "--save", str(tmp_path / "ckpt"), "--save-interval",
                                                    str(ITERATIONS)])[0]
    checkpoint = read_checkpoint(str(tmp_path / "ckpt"))
    assert checkpoint.model.keys() == trained.keys()
    from megatron.hf.examine import examine  # what tools/inspect_checkpoint.py prints first
    assert "mixture of experts: --num-experts 4 --expert-interval 2 --mlp-type residual --topk 1 " \
           "--moe-expert-parallel-size 1" in examine(str(tmp_path / "ckpt")).header
    for name, tensor in trained.items():
        torch.testing.assert_close(checkpoint.model[name], tensor, rtol=0, atol=0, msg=name)
    model, _ = load_model(str(tmp_path / "ckpt"), tokenizer_vocab_size=201, parallel_state=None,
                          kernels=PORTABLE_KERNELS,
                          dtype=torch.float32, device=torch.device("cpu"))
    assert model.state_dict().keys() == trained.keys()
    tokens = torch.randint(0, 200, (1, 16))
    assert model(tokens).shape == (1, 16, 256)  # generation's forward, eval capacity, every expert in this process
    with pytest.raises(InputError, match="no family's transformers class here has experts"):
        export_hf(str(tmp_path / "ckpt"), str(tmp_path / "hf"))
    with pytest.raises(InputError, match="runs on the plain engine only; add --target-no-pipeline-parallel"):
        reshape(str(tmp_path / "ckpt"), str(tmp_path / "reshaped"), TargetLayout(tensor=2, pipeline=1))
    # --skip-train evaluates the MoE checkpoint through the engine (DeepSpeed reads the expert files).
    _, validation = run_on_ranks(train_moe_whole, 1, [*flags, "--load", str(tmp_path / "ckpt"), "--skip-train",
                                                      "--eval-iters", "2"])[0]
    assert 0 < validation < 10


# --- counting active parameters ------------------------------------------------------------------------------

def test_flops_and_parameter_count_are_of_the_parameters_a_token_uses():
    from megatron.config.arguments import job_config
    from megatron.model.moe import active_parameter_count
    from megatron.training.flops import flops_per_iteration

    def moe(*flags):
        return job_config(validated("--num-experts", "4", "--no-pipeline-parallel", *flags)).moe

    shape = dict(global_batch_size=8, seq_length=32, num_layers=4, hidden_size=32, vocab_size=256)
    dense = flops_per_iteration(**shape)
    assert flops_per_iteration(**shape, moe=moe()) == pytest.approx(dense)  # top-1: one MLP per token, as dense
    one_mlp = 3 * 8 * 32 * 16 * 32 ** 2  # f x B x s x 16 h^2: one more MLP per token in each of the 2 MoE layers
    assert flops_per_iteration(**shape, moe=moe("--topk", "2")) == pytest.approx(dense + 2 * one_mlp)
    assert flops_per_iteration(**shape, moe=moe("--mlp-type", "residual")) == pytest.approx(dense + 2 * one_mlp)

    model = skewed_model()  # layer 2 holds 4 experts of 2 x (32 x 128) weights + 128 + 32 biases each
    expert = 2 * 32 * 128 + 128 + 32
    total = sum(p.numel() for p in model.parameters())
    assert active_parameter_count(model) == total - 3 * expert


def test_a_checkpoint_resumes_only_with_its_experts():
    from megatron.checkpoint.trainer.resume_plan import check_model_flags
    from megatron.errors import InputError
    recorded = {"num_layers": 2, "num_experts": [4], "expert_interval": 2, "mlp_type": "standard",
                "moe_expert_parallel_size": 2}
    check_model_flags("ckpt", recorded, dict(recorded))
    with pytest.raises(InputError, match=r"--num-experts \[1\] \(checkpoint: \[4\]\)"):
        check_model_flags("ckpt", recorded, {**recorded, "num_experts": [1]})
    check_model_flags("ckpt", {"num_layers": 2}, {**recorded, "num_experts": [1]})  # older checkpoints: not recorded


def test_a_checkpoint_at_tensor_parallel_size_two_resumes_only_with_its_experts_split_as_saved():
    from megatron.checkpoint.trainer.resume_plan import check_expert_split
    from megatron.errors import InputError
    split = {"num_experts": [4], "enable_expert_tensor_parallelism": True}
    whole = {"num_experts": [4]}  # older checkpoints do not record the flag: their experts are whole
    check_expert_split("ckpt", split, split, tensor=2)
    check_expert_split("ckpt", whole, {"enable_expert_tensor_parallelism": False}, tensor=2)
    check_expert_split("ckpt", split, whole, tensor=1)  # one tensor-parallel rank: shards are whole experts
    check_expert_split("ckpt", {"num_experts": [1], "enable_expert_tensor_parallelism": True}, whole, tensor=2)
    with pytest.raises(InputError, match="holds shards of each expert per tensor-parallel rank: add "
                                         "--enable-expert-tensor-parallelism"):
        check_expert_split("ckpt", split, whole, tensor=2)
    with pytest.raises(InputError, match="holds whole experts per tensor-parallel rank: drop"):
        check_expert_split("ckpt", whole, split, tensor=2)


@pytest.mark.parametrize("reentrant", [False, True], ids=["torch-recompute", "reentrant-recompute"])
def test_the_load_balancing_loss_keeps_its_gradient_under_activation_recomputation(reentrant):
    # The MoE losses leave each recomputed chunk as outputs: a reentrant checkpoint (DeepSpeed's kind), which runs
    # the forward without autograd, must still give the gate the gradient of --moe-loss-coeff x the aux loss.
    import dataclasses
    from torch.utils.checkpoint import checkpoint

    tokens = torch.randint(0, 200, (2, 32))
    grads = []
    for recompute, coeff in ((False, "0.1"), (True, "0.1"), (False, "0")):
        model = skewed_model("--disable-moe-token-dropping", "--moe-loss-coeff", coeff)
        torch.manual_seed(0)  # the same gate weights, and the same random token selection draws
        torch.nn.init.normal_(model.layers[1].mlp.deepspeed_moe.gate.wg.weight, std=0.5)
        model.config = dataclasses.replace(model.config, checkpoint_activations=recompute)
        if reentrant:
            model.checkpoint_layer = lambda function, *args: checkpoint(function, *args, use_reentrant=True)
        model(tokens, labels=tokens).backward()
        grads.append(model.layers[1].mlp.deepspeed_moe.gate.wg.weight.grad.clone())
    assert (grads[0] - grads[2]).abs().max() > 1e-4  # the MoE loss does reach the gate
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-7)
