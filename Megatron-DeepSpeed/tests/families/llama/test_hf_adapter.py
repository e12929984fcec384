"""Hugging Face Llama in and out (docs/huggingface.md): a seeded random transformers LlamaForCausalLM (GQA 4:2,
rope_theta 500000, untied head, sharded safetensors) imports at TP 2 and at PP 2 and computes transformers'
logits, exports back bit for bit; our checkpoint survives ours -> HF -> ours bit for bit; the rotary config keys
of transformers 4.x and 5.x; a tiny tokenizer.json (trained here with `tokenizers`, never downloaded) through
--tokenizer-type HFTokenizer. The full tier generates at TP 2 x DP 2 as transformers' generate does and
continues pre-training at TP 2 x PP 2 from transformers' loss, then exports with the tokenizer."""
import json
import os

import numpy as np
import pytest
import torch

from megatron.hf import files as hf_files
from megatron.hf.directory import model_config_from_hf
from megatron.families.llama import hf_adapter as hf_llama
from megatron.hf.conversions import export_hf, import_hf, tokenizer_files_of
from megatron.hf.examine import examine
from megatron.checkpoint.formats.reader import read_checkpoint
from megatron.checkpoint.reshape.target_writer import TargetLayout
from megatron.errors import InputError
from megatron.evaluation.lambada import split_target
from megatron.model.gpt import GPTModel
from megatron.model.gpt_config import gpt_config
from megatron.tokenizer import build_tokenizer
from tests.helpers.distributed import run_on_ranks
from tests.helpers.hf_imports import assert_transformers_logits, exported_and_original, hf_tensors, import_at
from tests.checkpoint.reshape.test_conversions import with_random_vectors

SENTENCES = ["the quick brown fox jumps over the lazy dog", "a llama eats grass in the high mountains",
             "pre-training reads many tokens", "the dog and the llama are friends", "mountains are high and cold",
             "quick thinking brown llamas jump over lazy foxes"] * 4
SEQ = 16
LLAMA_SHAPE = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                   max_position_embeddings=32, rms_norm_eps=1e-6)


def write_tokenizer(directory) -> int:
    """A small BPE tokenizer.json (Llama-like: <s> prepended by the post-processor, </s> the end of document) and
    its tokenizer_config.json; returns the vocabulary size."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers, decoders

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    tokenizer.train_from_iterator(SENTENCES, trainers.BpeTrainer(vocab_size=100,
                                                                  special_tokens=["<unk>", "<s>", "</s>"]))
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    os.makedirs(directory, exist_ok=True)
    tokenizer.save(os.path.join(directory, "tokenizer.json"))
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as handle:
        json.dump({"bos_token": "<s>", "eos_token": {"content": "</s>"}, "unk_token": "<unk>"}, handle)
    return tokenizer.get_vocab_size()


def llama(vocab_size: int, **overrides):
    """A seeded LlamaForCausalLM with random norms and biases."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(**{**LLAMA_SHAPE, "vocab_size": vocab_size, "num_key_value_heads": 2, "rope_theta": 500000.0,
                            "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, **overrides})
    return with_random_vectors(LlamaForCausalLM(config).eval(), "norm")


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """The transformers model and its tokenizer, saved in 20 KB safetensors shards."""
    directory = str(tmp_path_factory.mktemp("hf") / "llama")
    vocab_size = write_tokenizer(directory)
    llama(vocab_size).save_pretrained(directory, max_shard_size="20KB")
    assert os.path.isfile(os.path.join(directory, hf_files.INDEX_FILE))
    return directory


def our_model(save: str) -> GPTModel:
    checkpoint = read_checkpoint(save)
    model = GPTModel(gpt_config(checkpoint.model_config, checkpoint.padded_vocab_size)).eval()
    model.load_state_dict(dict(checkpoint.model))
    return model


@pytest.fixture(scope="module")
def imported(hf_dir, tmp_path_factory):
    """The model imported at TP 2 and at PP 2 (vocabulary padded to a multiple of 32 x TP)."""
    return import_at(hf_dir, tmp_path_factory, {"tp2": TargetLayout(2, 1), "pp2": TargetLayout(1, 2)})


@pytest.mark.parametrize("layout", ["tp2", "pp2"])
def test_imported_llama_computes_transformers_logits_and_exports_back_bit_for_bit(hf_dir, imported, layout,
                                                                                   tmp_path):
    from transformers import LlamaForCausalLM

    reference = LlamaForCausalLM.from_pretrained(hf_dir).eval()
    vocab = reference.config.vocab_size
    model = our_model(imported[layout])
    assert model.config.num_key_value_heads == 2 and model.config.rope_theta == 500000
    assert (vocab, model.config.vocab_size) == (100, 128)  # padded to a multiple of 32 x TP
    tokens = assert_transformers_logits(model, reference, vocab)

    exported = str(tmp_path / "exported")
    written, original = exported_and_original(imported[layout], hf_dir, exported, max_shard_bytes=30_000)
    assert written.keys() == original.keys()
    for name, tensor in original.items():
        assert tensor.dtype == torch.float32 and torch.equal(written[name], tensor), name
    config = json.loads(open(os.path.join(exported, hf_files.CONFIG_FILE)).read())
    assert {key: config[key] for key in ("num_key_value_heads", "tie_word_embeddings", "head_dim", "dtype",
                                         "torch_dtype", "rms_norm_eps", "bos_token_id", "eos_token_id")} == \
        {"num_key_value_heads": 2, "tie_word_embeddings": False, "head_dim": 8, "dtype": "float32",
         "torch_dtype": "float32", "rms_norm_eps": 1e-6, "bos_token_id": 1, "eos_token_id": 2}
    assert config["rope_parameters"] == {"rope_type": "default", "rope_theta": 500000.0}
    assert len(json.loads(open(os.path.join(exported, hf_files.INDEX_FILE)).read())["weight_map"]) == len(original)
    with torch.no_grad():
        assert torch.equal(LlamaForCausalLM.from_pretrained(exported).eval()(tokens).logits, reference(tokens).logits)


def test_ours_to_hf_to_ours_is_bit_identical_and_the_examiner_shows_llama(imported, tmp_path):
    exported, again = str(tmp_path / "hf"), str(tmp_path / "again")
    export_hf(imported["tp2"], exported)
    assert os.listdir(exported).count(hf_files.WEIGHTS_FILE) == 1  # under the default shard size: one file
    assert {"tokenizer.json", "tokenizer_config.json"} <= set(os.listdir(exported))  # recorded by the import
    import_hf(exported, again, TargetLayout(1, 2), make_vocab_size_divisible_by=64)
    first, second = read_checkpoint(imported["tp2"]), read_checkpoint(again)
    assert first.model_config == second.model_config and first.model.keys() == second.model.keys()
    for name in first.model:
        assert torch.equal(first.model[name], second.model[name]), name
    shown = examine(exported)
    assert shown.header[0] == f"Hugging Face LlamaForCausalLM model {exported}"
    assert "attention: 4 query heads in 2 key/value groups" in shown.header
    assert "--num-key-value-heads=2" in shown.header[-1] and "--rope-theta=500000" in shown.header[-1]
    assert "--imported-from=transformers LlamaForCausalLM" in examine(again).header[-1]


def test_tied_llama_with_biases_and_full_attention_round_trips(tmp_path):
    from transformers import LlamaForCausalLM

    reference = llama(70, num_key_value_heads=4, tie_word_embeddings=True, attention_bias=True, mlp_bias=True)
    reference.save_pretrained(tmp_path / "hf")
    import_hf(str(tmp_path / "hf"), str(tmp_path / "ckpt"), TargetLayout(2, 1), make_vocab_size_divisible_by=16)
    model = our_model(str(tmp_path / "ckpt"))
    assert not model.config.untie_embeddings_and_output_weights and model.config.add_bias_linear
    tokens = assert_transformers_logits(model, reference, 70, seed=2)
    written, original = exported_and_original(str(tmp_path / "ckpt"), tmp_path / "hf", str(tmp_path / "out"))
    original.pop("lm_head.weight", None)  # tied: transformers may or may not store it
    assert written.keys() == original.keys()
    assert all(torch.equal(written[name], tensor) for name, tensor in original.items())
    with torch.no_grad():
        assert torch.equal(LlamaForCausalLM.from_pretrained(tmp_path / "out").eval()(tokens).logits,
                           reference(tokens).logits)


def test_rotary_keys_of_transformers_4_and_5_and_a_length_dependent_rotary_refused(tmp_path):
    four = {**LLAMA_SHAPE, "model_type": "llama", "vocab_size": 64, "rope_theta": 500000.0, "rope_scaling": None,
            "torch_dtype": "bfloat16"}
    five = {**four, "rope_parameters": {"rope_type": "default", "rope_theta": 250000.0}}
    assert model_config_from_hf(hf_llama, four, "config.json").rope_theta == 500000
    assert model_config_from_hf(hf_llama, five, "config.json").rope_theta == 250000
    assert model_config_from_hf(hf_llama, {**LLAMA_SHAPE}, "config.json").rope_theta == 10000  # LlamaConfig's default
    scaled = {**five, "architectures": ["LlamaForCausalLM"],
              "rope_parameters": {"rope_type": "dynamic", "rope_theta": 500000.0, "factor": 8.0}}
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / hf_files.CONFIG_FILE).write_text(json.dumps(scaled))
    with pytest.raises(InputError, match=r"^.*config.json uses rotary type 'dynamic'; only default, linear, llama3, yarn "
                                         r"can be imported \(their frequencies do not change with the sequence length\)$"):
        import_hf(str(tmp_path / "hf"), str(tmp_path / "out"), TargetLayout(1, 1))
    assert not (tmp_path / "out").exists()
    with pytest.raises(InputError, match=r"sets hidden_act 'gelu'; only 'silu' \(SwiGLU\) can be imported"):
        model_config_from_hf(hf_llama, {**four, "hidden_act": "gelu"}, "config.json")


def test_a_missing_or_damaged_shard_is_named_in_one_line_and_nothing_is_written(hf_dir, tmp_path):
    import shutil

    copy = tmp_path / "hf"
    shutil.copytree(hf_dir, copy)
    shard = sorted(name for name in os.listdir(copy) if name.startswith("model-"))[1]
    (copy / shard).write_bytes((copy / shard).read_bytes()[:100])
    with pytest.raises(InputError, match=rf"^.*{shard} cannot be read .*; the file is missing, truncated or damaged$"):
        import_hf(str(copy), str(tmp_path / "out"), TargetLayout(1, 1))
    (copy / shard).unlink()
    with pytest.raises(InputError, match=rf"{shard} cannot be read"):
        import_hf(str(copy), str(tmp_path / "out"), TargetLayout(1, 1))
    assert not (tmp_path / "out").exists() and sorted(os.listdir(tmp_path)) == ["hf"]


def test_hf_tokenizer_gives_the_tokenizers_ids_and_its_special_tokens(hf_dir, tmp_path):
    from tokenizers import Tokenizer

    reference = Tokenizer.from_file(os.path.join(hf_dir, "tokenizer.json"))
    for path in (hf_dir, os.path.join(hf_dir, "tokenizer.json")):
        tokenizer = build_tokenizer("HFTokenizer", tokenizer_model=path)
        assert (tokenizer.vocab_size, tokenizer.eod, tokenizer.bos) == (reference.get_vocab_size(), 2, 1)
        for text in SENTENCES[:6]:
            assert tokenizer.tokenize(text) == reference.encode(text).ids and tokenizer.tokenize(text)[0] == 1
    ids, lengths = tokenizer.tokenize_batch(SENTENCES[:3])
    assert ids.tolist() == sum((reference.encode(text).ids for text in SENTENCES[:3]), [])
    assert lengths.tolist() == [len(reference.encode(text).ids) for text in SENTENCES[:3]]
    assert tokenizer.detokenize(tokenizer.tokenize("the lazy dog")) == "<s> the lazy dog"
    cloze = split_target(tokenizer, "the lazy dog", strict=True)  # the target word without a BOS of its own
    assert cloze.context[0] == 1 and cloze.target == reference.encode(" dog").ids[1:] and 1 not in cloze.target
    assert [name for _, name in tokenizer_files_of({"tokenizer_type": "HFTokenizer", "tokenizer_model": hf_dir})] == \
        ["tokenizer.json", "tokenizer_config.json"]
    with pytest.raises(InputError, match=r"^--tokenizer-model .*nowhere: no tokenizer.json there"):
        build_tokenizer("HFTokenizer", tokenizer_model=str(tmp_path / "nowhere"))


def test_preprocessing_with_hf_tokenizer_writes_its_ids_and_eod(hf_dir, tmp_path):
    from tokenizers import Tokenizer
    from megatron.data.indexed_dataset import MMapIndexedDataset
    from tools.preprocess_data import main as preprocess_main

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": text}) + "\n" for text in SENTENCES[:4]))
    preprocess_main(["--input", str(corpus), "--output-prefix", str(tmp_path / "out"), "--tokenizer-type",
                     "HFTokenizer", "--tokenizer-model", hf_dir, "--append-eod", "--workers", "2"])
    dataset = MMapIndexedDataset(str(tmp_path / "out_text_document"))
    reference = Tokenizer.from_file(os.path.join(hf_dir, "tokenizer.json"))
    assert [dataset[i].tolist() for i in range(len(dataset))] == \
        [reference.encode(text).ids + [2] for text in SENTENCES[:4]]


# --- the full tier: generation at TP 2 x DP 2, continued pre-training at TP 2 x PP 2 ---------------------------

def generate_on_ranks(argv):
    from tools.generate_text import main
    return main(argv)


@pytest.mark.full
def test_generation_at_tp2_dp2_equals_transformers_greedy(hf_dir, imported, tmp_path):
    from tokenizers import Tokenizer
    from transformers import LlamaForCausalLM

    prompts = ["the quick brown", "a llama eats", "mountains are", "the dog"]
    (tmp_path / "prompts.txt").write_text("\n".join(prompts) + "\n")
    argv = ["--load", imported["tp2"], "--prompt-file", str(tmp_path / "prompts.txt"), "--max-new-tokens", "8",
            "--greedy", "--micro-batch-size", "1", "--tensor-model-parallel-size", "2"]
    per_rank = run_on_ranks(generate_on_ranks, 4, argv)  # the tokenizer: the one the import recorded
    assert all(records == per_rank[0] for records in per_rank)
    reference = LlamaForCausalLM.from_pretrained(hf_dir).eval()
    tokenizer = Tokenizer.from_file(os.path.join(hf_dir, "tokenizer.json"))
    for prompt, record in zip(prompts, per_rank[0]):
        ids = torch.tensor([tokenizer.encode(prompt).ids])
        assert record["prompt_ids"] == ids[0].tolist()
        expected = reference.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
                                      eos_token_id=2, pad_token_id=2)[0, ids.shape[1]:].tolist()
        assert record["generated_ids"] == expected[:len(record["generated_ids"])] and \
            (record["generated_ids"] == expected or record["generated_ids"][-1] == 2)


def finetune_losses(argv):
    from tests.helpers.training import train
    result = train(argv)
    return None if result is None else result[0]


@pytest.mark.full
def test_continued_pretraining_at_tp2_pp2_starts_from_transformers_loss(hf_dir, tmp_path):
    """Every training sample is the same window (documents of SEQ tokens, all alike), so the first iteration's
    loss is transformers' loss on that window. The 100-entry vocabulary is left unpadded (50 x TP 2): padded rows
    score 0 and would take part in the softmax, as in upstream Megatron."""
    from transformers import LlamaForCausalLM
    from megatron.data.indexed_dataset import MMapIndexedDatasetBuilder

    window = build_tokenizer("HFTokenizer", tokenizer_model=hf_dir).tokenize(" ".join(SENTENCES[:3]))[:SEQ]
    assert len(window) == SEQ
    with MMapIndexedDatasetBuilder(str(tmp_path / "data"), np.uint16) as builder:
        for _ in range(64):
            builder.add_item(np.array(window))
            builder.end_document()
    save = str(tmp_path / "imported")
    import_hf(hf_dir, save, TargetLayout(2, 2), make_vocab_size_divisible_by=50)
    llama_flags = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--ffn-hidden-size", "48",
                   "--num-key-value-heads", "2", "--normalization", "rmsnorm", "--use-rotary-position-embeddings",
                   "--rotary-position-embeddings-theta", "500000", "--no-position-embedding", "--swiglu",
                   "--disable-bias-linear", "--untie-embeddings-and-output-weights", "--layernorm-epsilon", "1e-6",
                   "--max-position-embeddings", "32", "--no-query-key-layer-scaling"]
    argv = [*llama_flags, "--seq-length", str(SEQ), "--hidden-dropout", "0", "--attention-dropout", "0",
            "--tokenizer-type", "HFTokenizer", "--tokenizer-model", hf_dir, "--make-vocab-size-divisible-by", "50",
            "--data-path", str(tmp_path / "data"), "--split", "100,0,0", "--num-workers", "0", "--seed", "7",
            "--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", "1", "--lr", "1e-3",
            "--log-interval", "1", "--eval-iters", "0", "--load", save, "--finetune", "--save", str(tmp_path / "tuned"),
            "--save-interval", "1",
            "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"]
    losses = run_on_ranks(finetune_losses, 4, argv)[0]
    ids = torch.tensor([window + window[:1]])
    with torch.no_grad():
        expected = LlamaForCausalLM.from_pretrained(hf_dir).eval()(ids, labels=ids).loss.item()
    assert losses[0] == pytest.approx(expected, rel=1e-5)
    export_hf(str(tmp_path / "tuned"), str(tmp_path / "exported"))  # the tokenizer's files go along
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert open(os.path.join(tmp_path / "exported", name)).read() == open(os.path.join(hf_dir, name)).read()
    config = json.loads((tmp_path / "exported" / hf_files.CONFIG_FILE).read_text())
    assert (config["vocab_size"], config["bos_token_id"], config["eos_token_id"]) == (100, 1, 2)  # the tokenizer's
    assert LlamaForCausalLM.from_pretrained(tmp_path / "exported").config.num_key_value_heads == 2


def evaluate_on_ranks(argv):
    from tasks.zeroshot_gpt.evaluate import main
    return main(argv)


@pytest.mark.full
def test_wikitext_evaluation_at_tp2_dp2_equals_one_process(hf_dir, imported, tmp_path):
    from megatron.evaluation.zeroshot import wikitext_perplexity

    text = " ".join(SENTENCES[:12]) + " \n"
    (tmp_path / "wiki.tokens").write_text(text)
    argv = ["--load", imported["tp2"], "--tokenizer-type", "HFTokenizer", "--tokenizer-model", hf_dir,
            "--tensor-model-parallel-size", "2", "--micro-batch-size", "2", "--task", "WIKITEXT103",
            "--valid-data", str(tmp_path / "wiki.tokens"), "--seq-length", "16", "--overlapping-eval", "8"]
    results = run_on_ranks(evaluate_on_ranks, 4, argv)
    tokenizer = build_tokenizer("HFTokenizer", tokenizer_model=hf_dir)
    expected = wikitext_perplexity(our_model(imported["pp2"]), tokenizer, text, seq_length=16, overlapping_eval=8,
                                   batch_size=2)
    assert expected.tokens > 60
    for result in results:
        assert (result.tokens, result.words) == (expected.tokens, expected.words)
        assert result.summed_loss == pytest.approx(expected.summed_loss, rel=1e-5)


def test_a_tied_config_with_a_distinct_lm_head_imports_untied_as_transformers_loads_it(tmp_path, caplog):
    """tie_word_embeddings true but a stored lm_head.weight of its own: the tensors decide (transformers keeps the
    head), said in one line; an equal one stays tied."""
    from safetensors.torch import save_file

    reference = llama(70, tie_word_embeddings=False)
    reference.save_pretrained(tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / hf_files.CONFIG_FILE).read_text())
    (tmp_path / "hf" / hf_files.CONFIG_FILE).write_text(json.dumps({**config, "tie_word_embeddings": True}))
    with caplog.at_level("INFO", logger="megatron"):
        import_hf(str(tmp_path / "hf"), str(tmp_path / "ckpt"), TargetLayout(1, 1), make_vocab_size_divisible_by=16)
    assert "sets tie_word_embeddings, but the stored lm_head.weight differs from the word embedding" in caplog.text
    model = our_model(str(tmp_path / "ckpt"))
    tokens = torch.randint(0, 70, (2, 10), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens)[..., :70], reference(tokens).logits, rtol=1e-5, atol=1e-5)
    weights = hf_tensors(tmp_path / "hf")
    save_file({**weights, "lm_head.weight": weights[hf_llama.EMBEDDING].clone()},
              str(tmp_path / "hf" / hf_files.WEIGHTS_FILE))
    import_hf(str(tmp_path / "hf"), str(tmp_path / "tied"), TargetLayout(1, 1), make_vocab_size_divisible_by=16)
    assert not our_model(str(tmp_path / "tied")).config.untie_embeddings_and_output_weights


def test_conversion_inputs_are_checked_as_data_in_one_line_each(hf_dir, tmp_path):
    """A shard outside the directory or not a regular file, tensors the config has no place for, a bad rotary
    base, integer or NaN weights: each refused in one line before anything is written."""
    import shutil

    from safetensors.torch import save_file

    def copy(name):
        shutil.copytree(hf_dir, tmp_path / name)
        return tmp_path / name

    def refused(directory, message):
        with pytest.raises(InputError, match=message):
            import_hf(str(directory), str(tmp_path / "out"), TargetLayout(1, 1))
        assert not (tmp_path / "out").exists()

    def rewrite(directory, file, change):
        (directory / file).write_text(json.dumps(change(json.loads((directory / file).read_text()))))

    outside = copy("outside")
    shard = sorted(name for name in os.listdir(outside) if name.startswith("model-"))[0]
    shutil.move(outside / shard, tmp_path / shard)
    rewrite(outside, hf_files.INDEX_FILE, lambda index: {"weight_map": {
        name: f"../{shard}" if file == shard else file for name, file in index["weight_map"].items()}})
    refused(outside, rf"names the shard '\.\./{shard}', which is outside .*outside; an index names files of its own")
    fifo = copy("fifo")
    (fifo / shard).unlink()
    os.mkfifo(fifo / shard)
    refused(fifo, rf"{shard}, a shard .* names, is not a regular file \(a directory, FIFO, socket or device\)")
    fewer = copy("fewer")
    rewrite(fewer, hf_files.CONFIG_FILE, lambda config: {**config, "num_hidden_layers": 1})
    refused(fewer, r"the Hugging Face tensor 'model\.layers\.1\..*' is not part of the model .* describes")
    for theta in (None, "abc", -1):
        bad = copy(f"theta{theta}")
        rewrite(bad, hf_files.CONFIG_FILE, lambda config: {**config, "rope_theta": theta, "rope_parameters": None})
        refused(bad, rf"sets rope_theta {theta!r}; the rotary base must be a positive number")
    for name, change, message in (("int", lambda tensor: tensor.to(torch.int32), "holds torch.int32 values"),
                                  ("nan", lambda tensor: tensor.index_fill(0, torch.tensor([1]), float("nan")),
                                   "holds NaN or infinite values")):
        bad = copy(name)
        weights = hf_tensors(bad)
        for file in os.listdir(bad):
            if file.startswith("model"):
                (bad / file).unlink()
        target = "model.layers.0.mlp.down_proj.weight"
        save_file({**weights, target: change(weights[target])}, str(bad / hf_files.WEIGHTS_FILE))
        refused(bad, rf"the Hugging Face tensor '{target}' of .*{name} {message}")


def test_the_tokenizer_is_checked_at_import_and_a_padded_vocabulary_generates(tmp_path):
    """A tokenizer.json with more tokens than config.json's vocab_size is refused at import (its last ids would
    have no embedding row); fewer (a padded vocabulary, as DeepSeek-Coder's) imports and generates."""
    tokens = write_tokenizer(tmp_path / "large")
    llama(tokens - 10).save_pretrained(tmp_path / "large")
    with pytest.raises(InputError, match=rf"tokenizer.json has {tokens} tokens, more than the model's vocab_size "
                                         rf"{tokens - 10} in its config.json: ids from {tokens - 10} on would have no "):
        import_hf(str(tmp_path / "large"), str(tmp_path / "out"), TargetLayout(1, 1))
    write_tokenizer(tmp_path / "padded")
    llama(tokens + 28).save_pretrained(tmp_path / "padded")
    import_hf(str(tmp_path / "padded"), str(tmp_path / "ckpt"), TargetLayout(1, 1))
    records = run_on_ranks(generate_on_ranks, 1, ["--load", str(tmp_path / "ckpt"), "--prompt", "the dog",
                                                  "--max-new-tokens", "4", "--greedy"])[0]
    assert len(records[0]["generated_ids"]) == 4 and max(records[0]["generated_ids"]) < tokens


def test_an_import_whose_hf_directory_moved_exports_without_its_tokenizer(tmp_path):
    """The checkpoint names the HF directory's tokenizer; once that directory is gone, --to-hf writes the model
    alone (it asked for a tokenizer flag convert_checkpoint.py does not have)."""
    tokens = write_tokenizer(tmp_path / "hf")
    llama(tokens).save_pretrained(tmp_path / "hf")
    import_hf(str(tmp_path / "hf"), str(tmp_path / "ckpt"), TargetLayout(1, 1))
    original = hf_tensors(tmp_path / "hf")
    (tmp_path / "hf").rename(tmp_path / "moved")
    export_hf(str(tmp_path / "ckpt"), str(tmp_path / "out"))
    assert not (tmp_path / "out" / "tokenizer.json").exists()
    written = hf_tensors(tmp_path / "out")
    assert written.keys() == original.keys() and all(torch.equal(written[name], original[name]) for name in original)
