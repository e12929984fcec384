"""Scaled rotary embeddings in and out of Hugging Face (docs/huggingface.md): seeded random transformers
LlamaForCausalLM models with rope_type llama3 and yarn (original context 16, 64 positions) import at TP 2 and at
TP 2 x PP 2, compute transformers' logits (fp32, 1e-5) on 48 tokens, continue a short prompt and one longer than
the original context greedily as transformers' generate does, score WikiText-style perplexity as transformers'
loss, and export back with the same tensors, the
rope_parameters transformers 5.23 writes and bit-identical logits; transformers 4.x's rope_theta + rope_scaling
read as 5.x's rope_parameters; the types we do not compute refused in one line. The full tier generates at
TP 2 x DP 2 through tools/generate_text.py."""
import json
import os

import pytest
import torch

from megatron.hf import files as hf_files
from megatron.hf.conversions import export_hf, import_hf
from megatron.hf.directory import model_config_from_hf
from megatron.hf.examine import examine
from megatron.checkpoint.reshape.target_writer import TargetLayout
from megatron.checkpoint.formats.reader import read_checkpoint
from megatron.errors import InputError
from megatron.families import hf_rope
from megatron.families.llama import hf_adapter as hf_llama
from megatron.inference.generation import generate_batch
from megatron.inference.sampling import SamplingParams, prompt_generators
from tests.families.llama.test_hf_adapter import LLAMA_SHAPE, llama, our_model, write_tokenizer
from tests.helpers.hf_imports import hf_tensors
from tests.helpers.distributed import run_on_ranks

ORIGINAL, POSITIONS, THETA = 16, 64, 500000.0
ROPES = {"llama3": {"rope_type": "llama3", "rope_theta": THETA, "factor": 4.0, "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0, "original_max_position_embeddings": ORIGINAL},
         "yarn": {"rope_type": "yarn", "rope_theta": THETA, "factor": 4.0, "original_max_position_embeddings": ORIGINAL,
                  "beta_fast": 16.0, "beta_slow": 2.0, "mscale": 0.9, "mscale_all_dim": 0.5}}
# What our export writes back: transformers' keys for each, beta and truncate spelled out.
EXPORTED = {"llama3": ROPES["llama3"], "yarn": {**ROPES["yarn"], "truncate": True}}
LONG_PROMPT = "the quick brown fox jumps over the lazy dog and a llama eats grass in the high mountains"


@pytest.fixture(scope="module", params=list(ROPES))
def scaled(request, tmp_path_factory):
    """(kind, transformers directory, our checkpoints imported at TP 2 and at TP 2 x PP 2)."""
    kind = request.param
    directory = str(tmp_path_factory.mktemp(kind) / "hf")
    vocab_size = write_tokenizer(directory)
    llama(vocab_size, max_position_embeddings=POSITIONS, rope_parameters=ROPES[kind],
          initializer_range=0.3).save_pretrained(directory)  # weights large enough for positions to matter
    saved = {}
    for name, target in (("tp2", TargetLayout(2, 1)), ("tp2pp2", TargetLayout(2, 2))):
        saved[name] = str(tmp_path_factory.mktemp(name) / "ckpt")
        import_hf(directory, saved[name], target, make_vocab_size_divisible_by=32)
    return kind, directory, saved


def reference_model(directory):
    from transformers import LlamaForCausalLM
    return LlamaForCausalLM.from_pretrained(directory).eval()


def test_imported_scaled_llama_computes_transformers_logits_past_the_original_context(scaled):
    kind, directory, saved = scaled
    reference = reference_model(directory)
    assert reference.config.rope_parameters["rope_type"] == kind
    tp2, tp2pp2 = (read_checkpoint(saved[name]) for name in ("tp2", "tp2pp2"))
    assert tp2.model_config == tp2pp2.model_config and tp2.model.keys() == tp2pp2.model.keys()
    assert all(torch.equal(tp2.model[name], tp2pp2.model[name]) for name in tp2.model)
    config = tp2.model_config
    assert (config.rope_scaling_type, config.rope_scaling_factor, config.rope_theta,
            config.rope_scaling_original_max_position_embeddings) == (kind, 4.0, 500000, ORIGINAL)
    if kind == "yarn":
        assert (config.yarn_beta_fast, config.yarn_beta_slow, config.yarn_mscale, config.yarn_mscale_all_dim,
                config.yarn_correction_range_round_to_int) == (16.0, 2.0, 0.9, 0.5, True)
    model = our_model(saved["tp2"])
    vocab = reference.config.vocab_size
    tokens = torch.randint(0, vocab, (2, 48), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = reference(tokens).logits
        torch.testing.assert_close(model(tokens)[..., :vocab], expected, rtol=1e-5, atol=1e-5)
        unscaled = reference_model(directory)
        unscaled.model.rotary_emb.inv_freq.copy_(THETA ** (-torch.arange(0, 8, 2).float() / 8))
        assert (unscaled(tokens).logits - expected).abs().max() > 0.01  # the scaling matters here


def test_greedy_generation_equals_transformers_for_a_short_prompt_and_one_past_the_original_context(scaled):
    from tokenizers import Tokenizer

    _, directory, saved = scaled
    reference = reference_model(directory)
    tokenizer = Tokenizer.from_file(os.path.join(directory, "tokenizer.json"))
    prompts = [tokenizer.encode(text).ids for text in ("the quick brown", LONG_PROMPT)]
    assert len(prompts[0]) < ORIGINAL < len(prompts[1]) < POSITIONS - 20
    model = our_model(saved["tp2"])
    ours = generate_batch(model, prompts, 20, SamplingParams(), prompt_generators(1, range(2)), None,
                          reference.config.vocab_size)
    for prompt, generated in zip(prompts, ours):
        ids = torch.tensor([prompt])
        expected = reference.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=20, do_sample=False,
                                      eos_token_id=None, pad_token_id=0)
        assert generated == expected[0, len(prompt):].tolist()


def test_wikitext_perplexity_past_the_original_context_equals_transformers_loss(scaled, tmp_path):
    from megatron.evaluation.wikitext import detokenize_wikitext
    from megatron.evaluation.zeroshot import wikitext_perplexity
    from megatron.tokenizer import build_tokenizer

    directory = scaled[1]
    tokenizer = build_tokenizer("HFTokenizer", tokenizer_model=directory)
    text = LONG_PROMPT + " \n"
    tokens = list(tokenizer.tokenize(detokenize_wikitext(text)))
    assert ORIGINAL < len(tokens) <= 48  # one window of 48, longer than the original context
    unpadded = str(tmp_path / "unpadded")  # padded vocabulary rows would score 0 and join the softmax (upstream's)
    import_hf(directory, unpadded, TargetLayout(1, 1), make_vocab_size_divisible_by=tokenizer.vocab_size)
    ours = wikitext_perplexity(our_model(unpadded), tokenizer, text, seq_length=48, overlapping_eval=48,
                               batch_size=1)
    ids = torch.tensor([tokens])
    with torch.no_grad():
        expected = reference_model(directory)(ids, labels=ids).loss.item() * (len(tokens) - 1)
    assert ours.tokens == len(tokens) and ours.summed_loss == pytest.approx(expected, rel=1e-5)


def test_export_writes_transformers_rope_parameters_and_gives_identical_logits(scaled, tmp_path):
    kind, directory, saved = scaled
    exported = str(tmp_path / "exported")
    export_hf(saved["tp2pp2"], exported)
    original, written = hf_tensors(directory), hf_tensors(exported)
    assert written.keys() == original.keys()
    assert all(torch.equal(written[name], tensor) for name, tensor in original.items())
    config = json.loads(open(os.path.join(exported, hf_files.CONFIG_FILE)).read())
    assert config["rope_parameters"] == EXPORTED[kind]
    assert config["rope_theta"] == THETA and config["rope_scaling"] == {
        key: value for key, value in EXPORTED[kind].items() if key != "rope_theta"}  # transformers 4.x's keys
    reference, again = reference_model(directory), reference_model(exported)
    assert (again.config.rope_parameters, reference.config.rope_parameters) == (EXPORTED[kind], ROPES[kind])
    tokens = torch.randint(0, reference.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert torch.equal(again(tokens).logits, reference(tokens).logits)
    assert f"scaling {kind} " in " ".join(examine(exported).header)
    import_hf(exported, str(tmp_path / "again"), TargetLayout(1, 1), make_vocab_size_divisible_by=32)
    assert read_checkpoint(str(tmp_path / "again")).model_config == read_checkpoint(saved["tp2"]).model_config


def test_transformers_4_keys_and_left_out_values_read_as_transformers_5_23_reads_them():
    base = {**LLAMA_SHAPE, "max_position_embeddings": POSITIONS}
    four = {**base, "rope_theta": 1000000.0, "rope_scaling": {"type": "yarn", "factor": 4.0,
                                                               "original_max_position_embeddings": ORIGINAL}}
    five = {**base, "rope_parameters": {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
                                        "original_max_position_embeddings": ORIGINAL}}
    assert model_config_from_hf(hf_llama, four, "c") == model_config_from_hf(hf_llama, five, "c")
    both = {**five, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}  # transformers 5.23: rope_scaling wins
    assert hf_rope.rope_flags_from_hf(both, "c")["rope_scaling_type"] == "linear"
    assert hf_rope.rope_flags_from_hf(four, "c") == {
        "rope_theta": 1000000, "rope_scaling_type": "yarn", "rope_scaling_factor": 4.0,
        "rope_scaling_original_max_position_embeddings": ORIGINAL, "yarn_beta_fast": 32.0, "yarn_beta_slow": 1.0}
    # YaRN: factor from the contexts, beta 0 as the default, a lone mscale ignored, a top-level original first.
    left_out = {**base, "original_max_position_embeddings": 8, "rope_parameters": {
        "rope_type": "yarn", "original_max_position_embeddings": ORIGINAL, "beta_fast": 0, "mscale": 0.7}}
    assert hf_rope.rope_flags_from_hf(left_out, "c") == {
        "rope_theta": 10000, "rope_scaling_type": "yarn", "rope_scaling_factor": 8.0,
        "rope_scaling_original_max_position_embeddings": 8, "yarn_beta_fast": 32.0, "yarn_beta_slow": 1.0}
    llama3 = {**base, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0}, "rope_theta": 500000.0}
    config = model_config_from_hf(hf_llama, llama3, "c")
    assert (config.rope_scaling_type, config.rope_scaling_original_max_position_embeddings) == ("llama3", POSITIONS)
    linear = model_config_from_hf(hf_llama, {**base, "rope_scaling": {"type": "linear", "factor": 2.0}}, "c")
    assert (linear.rope_scaling_type, linear.rope_scaling_factor) == ("linear", 2.0)
    given = hf_rope.rope_flags_from_hf({**five, "rope_parameters": {**five["rope_parameters"],
                                                                     "attention_factor": 1.5}}, "c")
    assert given["yarn_attention_factor"] == 1.5


@pytest.mark.parametrize("kind", ["dynamic", "longrope", "ntk-by-parts"])
def test_a_rotary_type_we_do_not_compute_is_refused_in_one_line_naming_it(kind, tmp_path):
    config = {**LLAMA_SHAPE, "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 64,
              "rope_parameters": {"rope_type": kind, "rope_theta": 10000.0, "factor": 2.0}}
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / hf_files.CONFIG_FILE).write_text(json.dumps(config))
    with pytest.raises(InputError, match=rf"^\S*config.json uses rotary type '{kind}'; only default, linear, llama3, "
                                         r"yarn can be imported \(their frequencies do not change with the "
                                         r"sequence length\)$"):
        import_hf(str(tmp_path / "hf"), str(tmp_path / "out"), TargetLayout(1, 1))
    assert not (tmp_path / "out").exists()
    with pytest.raises(InputError, match=r"^c uses rotary scaling 'linear' without a factor; add "
                                         r"rope_parameters.factor$"):
        hf_rope.rope_flags_from_hf({"rope_scaling": {"type": "linear"}}, "c")


def generate_on_ranks(argv):
    from tools.generate_text import main
    return main(argv)


@pytest.mark.full
def test_generation_at_tp2_dp2_equals_transformers_greedy(scaled, tmp_path):
    from tokenizers import Tokenizer

    _, directory, saved = scaled
    prompts = ["the quick brown", LONG_PROMPT, "a llama eats", LONG_PROMPT.replace("fox", "dog")]
    (tmp_path / "prompts.txt").write_text("\n".join(prompts) + "\n")
    argv = ["--load", saved["tp2"], "--prompt-file", str(tmp_path / "prompts.txt"), "--max-new-tokens", "12",
            "--greedy", "--micro-batch-size", "1", "--tensor-model-parallel-size", "2"]
    per_rank = run_on_ranks(generate_on_ranks, 4, argv)
    assert all(records == per_rank[0] for records in per_rank)
    reference = reference_model(directory)
    tokenizer = Tokenizer.from_file(os.path.join(directory, "tokenizer.json"))
    for prompt, record in zip(prompts, per_rank[0]):
        ids = torch.tensor([tokenizer.encode(prompt).ids])
        expected = reference.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
                                      eos_token_id=2, pad_token_id=2)[0, ids.shape[1]:].tolist()
        assert record["generated_ids"] == expected[:len(record["generated_ids"])] and \
            (record["generated_ids"] == expected or record["generated_ids"][-1] == 2)
