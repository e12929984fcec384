"""The checkpoint tools in one process, without training: Hugging Face GPT-2 import and export (a seeded random
GPT2LMHeadModel, no download), reshaping written checkpoints, the examiner, the resume plan's decisions, and one
clear message for each kind of bad input with nothing written."""
import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys

import pytest
import torch

from tests.helpers.paths import PACKAGE_ROOT

from megatron.hf import files as hf_files
from megatron.hf.conversions import export_hf, import_hf
from megatron.checkpoint.reshape.conversions import reshape
from megatron.checkpoint.formats.detect import Layout
from megatron.hf.examine import differences, examine
from megatron.checkpoint.formats.reader import read_checkpoint
from megatron.checkpoint.trainer.resume_plan import LoadOptions, plan_resume, resolve_schedule
from megatron.checkpoint.shards import shard_of
from megatron.checkpoint.formats.weight_units import TensorShard
from megatron.checkpoint.reshape.target_writer import TargetLayout
from megatron.config.model_config import ModelConfig
from megatron.errors import InputError, run_cli
from megatron.model.gpt import GPTModel
from megatron.model.gpt_config import gpt_config

HF_VOCAB = 100


def hf_model(activation="gelu"):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=HF_VOCAB, n_positions=16, n_embd=32, n_layer=2, n_head=4, n_inner=48,
                        activation_function=activation, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return with_random_vectors(GPT2LMHeadModel(config).eval(), ".ln_")


def with_random_vectors(model, norm_marker: str):
    """`model` with random norm weights (near 1; names containing norm_marker) and biases (near 0), so a mixed-up
    mapping cannot go unnoticed."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.dim() == 1:
                parameter.normal_(mean=1.0 if norm_marker in name else 0.0, std=0.1)
    return model


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("hf") / "gpt2"
    hf_model().save_pretrained(directory)
    return str(directory)


@pytest.fixture(scope="module")
def imported(hf_dir, tmp_path_factory):
    """The HF model imported at TP 2 x PP 2, its 100-entry vocabulary padded to 128 rows (a multiple of 32 x 2)."""
    save = str(tmp_path_factory.mktemp("imported") / "ckpt")
    import_hf(hf_dir, save, TargetLayout(2, 2), make_vocab_size_divisible_by=32)
    return save


def nothing_written(parent):
    return [name for name in os.listdir(parent) if ".tmp-" in name or ".old-" in name] == []


# --- Hugging Face round trip -----------------------------------------------------------------------------------

@pytest.mark.parametrize("activation, openai_gelu", [("gelu", False), ("gelu_new", True)])
def test_imported_model_computes_hf_logits(tmp_path, activation, openai_gelu):
    reference = hf_model(activation)
    reference.save_pretrained(tmp_path / "hf", max_shard_size="20KB")  # sharded, as a large model is
    assert (tmp_path / "hf" / hf_files.INDEX_FILE).is_file()
    import_hf(str(tmp_path / "hf"), str(tmp_path / "ckpt"), TargetLayout(1, 1), make_vocab_size_divisible_by=64)
    checkpoint = read_checkpoint(str(tmp_path / "ckpt"))
    assert checkpoint.padded_vocab_size == 128 and checkpoint.iteration == 0
    config = gpt_config(checkpoint.model_config, checkpoint.padded_vocab_size)
    assert config.openai_gelu is openai_gelu
    model = GPTModel(config).eval()
    model.load_state_dict(dict(checkpoint.model))
    tokens = torch.randint(0, HF_VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, theirs = model(tokens)[..., :HF_VOCAB], reference(input_ids=tokens).logits
    assert (ours - theirs).abs().max() < 1e-5


def test_hf_round_trip_through_a_tp2_pp2_checkpoint_is_identical(hf_dir, imported, tmp_path):
    from safetensors.torch import load_file

    assert read_checkpoint(imported).layout.describe() == \
        "TP 2 x PP 2, any DP and ZeRO stage, pipeline engine"
    export_hf(imported, str(tmp_path / "exported"))
    original, exported = (load_file(os.path.join(path, hf_files.WEIGHTS_FILE)) for path in (hf_dir, tmp_path / "exported"))
    original.pop("lm_head.weight", None)  # tied to wte; transformers may or may not store it
    assert exported.keys() == original.keys()
    for name, tensor in original.items():
        assert torch.equal(exported[name], tensor), name
    config = json.loads((tmp_path / "exported" / hf_files.CONFIG_FILE).read_text())
    assert config["vocab_size"] == HF_VOCAB and config["activation_function"] == "gelu"
    from transformers import GPT2LMHeadModel
    reloaded = GPT2LMHeadModel.from_pretrained(tmp_path / "exported").eval()
    tokens = torch.arange(10).unsqueeze(0)
    with torch.no_grad():
        assert torch.equal(reloaded(input_ids=tokens).logits, hf_model()(input_ids=tokens).logits)


# --- reshaping and the examiner --------------------------------------------------------------------------------

def test_a_gpt2_directory_storing_an_lm_head_of_its_own_is_refused_in_one_line(hf_dir, tmp_path):
    """GPT2LMHeadModel's head is its word embedding (ALWAYS_TIED): a different stored lm_head is another model's."""
    from safetensors.torch import load_file, save_file

    copy = tmp_path / "gpt2"
    shutil.copytree(hf_dir, copy)
    weights = load_file(str(copy / hf_files.WEIGHTS_FILE))
    save_file({**weights, "lm_head.weight": weights["transformer.wte.weight"] + 1.0}, str(copy / hf_files.WEIGHTS_FILE))
    with pytest.raises(InputError, match="stores an lm_head.weight different from its word embedding, but a "
                                         "GPT2LMHeadModel's head is the word embedding"):
        import_hf(str(copy), str(tmp_path / "ckpt"), TargetLayout(1, 1))
    assert not (tmp_path / "ckpt").exists()


def test_reshaped_copy_compares_equal_and_a_changed_one_does_not(imported, tmp_path):
    reshape(imported, str(tmp_path / "tp1"), TargetLayout(1, 1, pipeline_engine=False))
    reshaped = read_checkpoint(str(tmp_path / "tp1"))
    assert reshaped.layout.tensor == 1 and not reshaped.layout.pipeline_engine
    assert max(differences(examine(imported), examine(str(tmp_path / "tp1"))).values()) == 0.0
    assert "--layernorm-epsilon=1e-05 " in examine(imported).header[-1]  # the model's flags, from the mapping
    from tools.inspect_checkpoint import main as inspect_main
    assert inspect_main([imported, str(tmp_path / "tp1")]) == 0
    changed = dict(reshaped.model)
    changed["layers.1.mlp.dense_4h_to_h.bias"] = changed["layers.1.mlp.dense_4h_to_h.bias"] + 0.5
    from megatron.hf.examine import Examined
    diffs = differences(examine(imported), Examined([], changed, from_hf=False))
    assert diffs["layers.1.mlp.dense_4h_to_h.bias"] == pytest.approx(0.5)
    assert sum(diff > 0 for diff in diffs.values()) == 1


def test_a_tensor_shard_reads_only_the_files_it_overlaps(imported, tmp_path):
    """Generation and evaluation read their rank's shards: from a TP2 checkpoint, rank 0 of 2 and rank 1 of 4
    need only source rank 0's files (source rank 1's are deleted here) and get exactly the shards of the full
    tensors."""
    full = read_checkpoint(imported)
    copy = tmp_path / "ckpt"
    shutil.copytree(imported, copy, symlinks=True)
    removed = [path.unlink() for path in copy.glob("global_step*/layer_*-model_01-model_states.pt")]
    assert removed
    for rank, size in ((0, 2), (1, 4)):
        part = read_checkpoint(str(copy), part=TensorShard(rank, size))
        assert part.padded_vocab_size == full.padded_vocab_size and part.model.keys() == full.model.keys()
        for name, tensor in full.model.items():
            assert torch.equal(part.model[name], shard_of(name, tensor, rank, size)), name
    with pytest.raises(InputError, match="model_01-model_states.pt is missing"):
        read_checkpoint(str(copy), part=TensorShard(1, 2))


def test_shards_join_back():
    full = torch.arange(24.0).view(4, 6)
    assert torch.equal(torch.cat([shard_of("layers.0.mlp.dense_4h_to_h.weight", full, r, 3) for r in range(3)], 1),
                       full)
    assert torch.equal(shard_of("layers.0.input_layernorm.weight", full, 1, 2), full)


# --- resume decisions ------------------------------------------------------------------------------------------

RUN = Layout(tensor=2, pipeline=2, data=1, zero_stage=1, pipeline_engine=True)
MODEL_FLAGS = ModelConfig(num_layers=2, hidden_size=32, num_attention_heads=4, ffn_hidden_size=48,
                          max_position_embeddings=16).to_flags()  # what the trainer passes: every model flag


def test_resume_plan_of_a_reshaped_checkpoint(imported):
    plan = plan_resume(imported, dataclasses.replace(RUN, data=4), LoadOptions(finetune=True), "fp32", MODEL_FLAGS)
    assert (plan.universal, plan.load_optimizer, plan.restore_progress, plan.load_rng) == (False, False, False, False)
    assert plan.padded_vocab_size == 128
    with pytest.raises(InputError, match=r"TP 2 x PP 2, any DP .* but this run is TP 1 x PP 1 x DP 1.*\n.*"
                                         r"convert_checkpoint.py --load .* --target-tensor-parallel-size 1 "
                                         r"--target-pipeline-parallel-size 1"):
        plan_resume(imported, Layout(1, 1, 1, 1, True), LoadOptions(), "fp32", MODEL_FLAGS)
    with pytest.raises(InputError, match=r"--hidden-size 64 \(checkpoint: 32\)"):
        plan_resume(imported, RUN, LoadOptions(), "fp32", {**MODEL_FLAGS, "hidden_size": 64})
    assert plan_resume(None, RUN, LoadOptions(), "fp32", MODEL_FLAGS) is None


def test_schedule_flags_must_match_unless_told(imported):
    plan = plan_resume(imported, RUN, LoadOptions(), "fp32", MODEL_FLAGS)
    assert (plan.tokens, plan.seq_length) == (0, 16)  # what the loop judges a curriculum by (training/loop.py)
    plan = type(plan)(**{**plan.__dict__, "schedule": {**plan.schedule, "lr": 0.01}})
    run = {"lr": 0.02}
    with pytest.raises(InputError, match=r"--lr 0.02 \(checkpoint: 0.01\).*--override-lr-scheduler"):
        resolve_schedule(run, plan, LoadOptions())
    assert resolve_schedule(run, plan, LoadOptions(override_lr_scheduler=True)) == {}
    assert resolve_schedule(run, plan, LoadOptions(use_checkpoint_lr_scheduler=True)) == {"lr": 0.01}


@pytest.mark.parametrize("kind, precision, stage", [
    ("universal", "fp32", None),  # its ZeRO-0 form loads at the default stage
    ("universal", "bf16", 1),  # that form is fp32's: ZeRO's universal loader reads it in bf16
    ("zero0-pipeline", "fp32", None),  # saved at the stage the run has
])
def test_a_run_that_chose_no_zero_stage_resumes_at_a_stage_that_loads_the_optimizer_state(tmp_path, kind, precision,
                                                                                          stage):
    from tests.checkpoint.formats.test_weight_units import adam_source

    from megatron.checkpoint.formats.detect import read_client_state
    from megatron.checkpoint.formats.locate import checkpoint_directory
    from megatron.checkpoint.file_names import ARGS

    directory = adam_source(kind, str(tmp_path / "source"))
    recorded = read_client_state(checkpoint_directory(directory), verify=False)[ARGS]
    default = Layout(tensor=2, pipeline=2, data=1, zero_stage=0, pipeline_engine=True)  # the default over one DP rank
    plan = plan_resume(directory, default, LoadOptions(), precision, recorded, zero_stage_chosen=False)
    assert plan.load_optimizer and plan.zero_stage == stage and plan.universal == (stage == 1)
    if stage is not None:
        with pytest.raises(InputError, match="converted for fp32 training and this run trains in bf16"):
            plan_resume(directory, default, LoadOptions(), precision, recorded, zero_stage_chosen=True)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_a_zero0_checkpoint_resumed_in_another_precision_says_what_changed_and_how_to_convert(tmp_path, precision):
    """Its optimizer state is in its precision's form: refused in one line (not called damaged, no KeyError)."""
    from tests.checkpoint.formats.test_weight_units import adam_source

    from megatron.checkpoint.formats.detect import read_client_state
    from megatron.checkpoint.formats.locate import checkpoint_directory
    from megatron.checkpoint.file_names import ARGS

    directory = adam_source("zero0-pipeline", str(tmp_path / "source"))  # trained in fp32
    recorded = read_client_state(checkpoint_directory(directory), verify=False)[ARGS]
    run = Layout(tensor=2, pipeline=2, data=1, zero_stage=0, pipeline_engine=True)
    sliced = " --target-data-parallel-size 1" if precision == "bf16" else ""
    for chosen in (True, False):
        with pytest.raises(InputError, match=(
                rf"^--load {directory}: it trained in fp32 at ZeRO stage 0, whose optimizer state is in fp32's form, "
                rf"and this run trains in {precision}; resume it with neither --fp16 nor --bf16, pass --no-load-optim "
                rf"\(weights only\), or convert .*\n  .*convert_checkpoint.py --load {directory} .*--target-"
                rf"{precision}{sliced}\nthen --load the new directory$")):
            plan_resume(directory, run, LoadOptions(), precision, recorded, zero_stage_chosen=chosen)
    assert plan_resume(directory, run, LoadOptions(no_load_optim=True), precision, recorded) is not None


# --- bad input: one clear message each, nothing written --------------------------------------------------------

def test_missing_and_non_checkpoint_directories(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        read_checkpoint(str(tmp_path / "nowhere"))
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.txt").write_text("hello")
    with pytest.raises(InputError, match="is not a checkpoint directory"):
        reshape(str(tmp_path / "notes"), str(tmp_path / "out"), TargetLayout(1, 1))
    assert not (tmp_path / "out").exists() and nothing_written(tmp_path)


def test_latest_naming_a_missing_step(imported, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "latest").write_text("global_step7")
    with pytest.raises(InputError, match="names checkpoint 'global_step7', but .* does not exist"):
        read_checkpoint(str(broken))


def test_truncated_shard_is_named(imported, tmp_path):
    import shutil
    copy = tmp_path / "copy"
    shutil.copytree(imported, copy)
    shard = copy / "global_step0" / "layer_01-model_01-model_states.pt"
    shard.write_bytes(shard.read_bytes()[:200])
    with pytest.raises(InputError, match=r"layer_01-model_01-model_states.pt has 200 bytes, but \d+ were written .*"
                                         r"truncated"):
        reshape(str(copy), str(tmp_path / "out"), TargetLayout(1, 1))
    assert not (tmp_path / "out").exists() and nothing_written(tmp_path)


def test_hf_directory_of_another_architecture(tmp_path):
    (tmp_path / "phi3").mkdir()
    (tmp_path / "phi3" / hf_files.CONFIG_FILE).write_text(json.dumps({"model_type": "phi3",
                                                                "architectures": ["Phi3ForCausalLM"]}))
    with pytest.raises(InputError, match=r"describes a 'phi3' model \(Phi3ForCausalLM\); only gpt2 "
                                         r"\(GPT2LMHeadModel\), llama \(LlamaForCausalLM\).* can be imported"):
        import_hf(str(tmp_path / "phi3"), str(tmp_path / "out"), TargetLayout(1, 1))
    assert not (tmp_path / "out").exists() and nothing_written(tmp_path)


def test_target_tensor_parallel_size_must_divide_the_heads(imported, tmp_path):
    with pytest.raises(InputError, match="--target-tensor-parallel-size 3 does not divide the attention heads"):
        reshape(imported, str(tmp_path / "out"), TargetLayout(3, 1))
    assert not (tmp_path / "out").exists() and nothing_written(tmp_path)


def tree(directory) -> dict:
    return {str(path): path.read_bytes() for path in sorted(directory.rglob("*")) if path.is_file()}


def test_an_output_that_is_contains_or_lies_inside_an_input_is_refused_with_force_too(imported, hf_dir, tmp_path):
    """--force replaces an output; never the checkpoint or HF model it reads (nor the tokenizer an import names)."""
    checkpoint, model = shutil.copytree(imported, tmp_path / "parent" / "ckpt"), shutil.copytree(hf_dir, tmp_path / "hf")
    before = tree(tmp_path)
    refused = [
        ("--to-hf .* is --load", lambda: export_hf(str(checkpoint), str(checkpoint), force=True)),
        ("--to-hf .* contains --load", lambda: export_hf(str(checkpoint), str(tmp_path / "parent"), force=True)),
        ("--save .* is --load", lambda: reshape(str(checkpoint), str(checkpoint), TargetLayout(1, 1), force=True)),
        ("--save .* lies inside --load", lambda: reshape(str(checkpoint), str(checkpoint / "sub"),
                                                         TargetLayout(1, 1), force=True)),
        ("--save .* is --from-hf", lambda: import_hf(str(model), str(model), TargetLayout(1, 1), force=True)),
        ("--save .* contains --from-hf", lambda: import_hf(str(model), str(tmp_path), TargetLayout(1, 1), force=True)),
    ]
    for message, convert in refused:
        with pytest.raises(InputError, match=message + r" .*choose a directory apart from the input"):
            convert()
    assert tree(tmp_path) == before


def test_a_conversion_refuses_a_second_writer_and_an_output_that_appeared_while_it_ran(imported, tmp_path):
    """Two conversions into one --save: the second is refused at once, naming the first; a directory made at
    --save while a conversion runs (a user's file in it) is kept and the conversion's output dropped."""
    from megatron.files.atomic import write_directory_atomically

    target = tmp_path / "out"

    def second_writer_and_user(directory):
        second = subprocess.run([sys.executable, os.path.join(PACKAGE_ROOT, "tools", "convert_checkpoint.py"), "--load",
                                 imported, "--save", str(target)], capture_output=True, text=True,
                                env={**os.environ, "PYTHONPATH": PACKAGE_ROOT})
        assert (second.returncode, second.stderr.splitlines()[-1]) == (2, (
            f"error: {target} is being written by another process (pid {os.getpid()} on host "
            f"{socket.gethostname()}); wait for it to finish, or choose another directory"))
        target.mkdir()
        (target / "mine.txt").write_text("a user's file")
        (tmp_path / "filled").write_text(directory)

    with pytest.raises(InputError, match=f"{target} appeared while this run wrote it and is left as it is"):
        write_directory_atomically(str(target), second_writer_and_user)
    assert tree(target) == {str(target / "mine.txt"): b"a user's file"}
    assert sorted(os.listdir(tmp_path)) == ["filled", "out"]  # no temporary, no lock file


def test_the_next_writer_removes_the_temporary_a_killed_conversion_left(imported, tmp_path, caplog):
    stale = tmp_path / "out.tmp-k1ll3d"
    (stale / "global_step1").mkdir(parents=True)
    (stale / "global_step1" / "big.pt").write_bytes(b"0" * 1000)
    with caplog.at_level("INFO", logger="megatron"):
        reshape(imported, str(tmp_path / "out"), TargetLayout(1, 1))
    assert sorted(os.listdir(tmp_path)) == ["out"]
    assert f"removed {stale}, left by a writer of {tmp_path / 'out'} that was killed" in caplog.text


@pytest.mark.parametrize("direction", ["--to-hf", "--save"])
def test_a_conversion_the_storage_refuses_is_one_line_naming_the_cause(imported, tmp_path, direction):
    """A file-size limit (as a full disk, a write the storage refuses; torch and safetensors word it their own way):
    one line with the cause, exit 1, nothing left behind."""
    import resource

    limit = 20_000

    def limited():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    target = str(tmp_path / "out")
    done = subprocess.run([sys.executable, os.path.join(PACKAGE_ROOT, "tools", "convert_checkpoint.py"), "--load",
                           imported, direction, target], capture_output=True, text=True, preexec_fn=limited,
                          env={**os.environ, "PYTHONPATH": PACKAGE_ROOT})
    assert (done.returncode, done.stderr.splitlines()[-1]) == (1, (
        f"error: writing {target} failed: a file exceeds the file-size limit (EFBIG): ulimit -f allows {limit} bytes "
        f"per file; its partial files were removed and {target} is as it was: make room (or choose another "
        "directory) and run again"))
    assert os.listdir(tmp_path) == []


def test_a_pytorch_model_bin_holding_code_is_refused_as_untrusted_code_not_as_damaged(hf_dir, tmp_path):
    from tests.checkpoint.test_trust import Planted

    copy = tmp_path / "hf"
    shutil.copytree(hf_dir, copy)
    weights = {name: tensor for name, tensor in hf_files.open_weights(str(copy)).items()}
    (copy / hf_files.WEIGHTS_FILE).unlink()
    torch.save({**weights, "planted": Planted(str(tmp_path / "MARKER"))}, copy / hf_files.LEGACY_WEIGHTS_FILE)
    with pytest.raises(InputError, match=rf"^checkpoint file .*{hf_files.LEGACY_WEIGHTS_FILE} holds io.open, "
                                         r"which a checkpoint may not hold \(loading it could run code\), so it is refused as untrusted code; "):
        import_hf(str(copy), str(tmp_path / "out"), TargetLayout(1, 1))
    assert sorted(os.listdir(tmp_path)) == ["hf"]


def test_existing_output_needs_force(imported, tmp_path, capsys):
    from tools.convert_checkpoint import main as convert_main
    (tmp_path / "out").mkdir()
    argv = ["--load", imported, "--save", str(tmp_path / "out"), "--target-tensor-parallel-size", "1"]
    with pytest.raises(SystemExit) as stopped:
        run_cli(convert_main, argv)
    assert stopped.value.code == 2 and "already exists" in capsys.readouterr().err
    convert_main([*argv, "--force"])
    assert read_checkpoint(str(tmp_path / "out")).layout.tensor == 1 and nothing_written(tmp_path)
    # One progress bar on stderr (its updates end in carriage returns), not a printed line per step.
    output = capsys.readouterr()
    assert "reading piece" not in output.out and len(output.out.splitlines()) == 2
    assert output.err.count("reshaping: ") >= 2 and output.err.count("\n") == 1


def test_a_swiglu_model_reshaped_from_tp1_to_tp2_and_back_computes_the_same_logits(tmp_path):
    """SwiGLU's dense_h_to_4h rows are each rank's [gate_r; up_r] halves (upstream main's): reshaping TP 1 -> 2
    regroups them (rank r holds upstream's [gate_r; up_r]), TP 2 -> 1 joins them back bit for bit, and each
    checkpoint computes the first model's logits."""
    from megatron.checkpoint.reshape.target_writer import TrainingState, write_checkpoint
    model_config = ModelConfig(num_layers=2, hidden_size=16, num_attention_heads=4, max_position_embeddings=16,
                               ffn_hidden_size=24, hidden_dropout=0.0, attention_dropout=0.0, normalization="rmsnorm",
                               add_position_embedding=False, use_rotary_position_embeddings=True, swiglu=True,
                               num_key_value_heads=2, untie_embeddings_and_output_weights=True)
    config = gpt_config(model_config, 64)
    torch.manual_seed(0)
    model = GPTModel(config).eval()
    flags = {**model_config.to_flags(), "seq_length": 16, "tokenizer_vocab_size": 64}
    paths = {name: str(tmp_path / name) for name in ("tp1", "tp2", "back")}
    write_checkpoint(paths["tp1"], model.state_dict(), config, TrainingState(3, 24, flags), TargetLayout(1, 1))
    reshape(paths["tp1"], paths["tp2"], TargetLayout(2, 1))
    reshape(paths["tp2"], paths["back"], TargetLayout(1, 1))
    tokens = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    rows = "layers.1.mlp.dense_h_to_4h.weight"
    gate, up = model.state_dict()[rows].chunk(2)
    for rank in range(2):
        assert torch.equal(read_checkpoint(paths["tp2"], part=TensorShard(rank, 2)).model[rows],
                           torch.cat((gate.chunk(2)[rank], up.chunk(2)[rank])))
    with torch.no_grad():
        expected = model(tokens)
        for name, path in paths.items():
            weights = read_checkpoint(path).model
            if name == "back":
                assert all(torch.equal(weights[key], tensor) for key, tensor in model.state_dict().items())
            copy = GPTModel(config).eval()
            copy.load_state_dict(dict(weights))
            torch.testing.assert_close(copy(tokens), expected, rtol=0, atol=0, msg=name)
