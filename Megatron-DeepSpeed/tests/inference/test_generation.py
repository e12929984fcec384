"""Text generation on in-memory models: greedy decoding equals transformers' generate on the same weights, the KV
cache equals recomputing the sequence, sampling is seeded per prompt, batches of different lengths are padded
correctly, and prompts are read and checked with clear errors."""
import dataclasses
import json

import pytest
import torch

from megatron.families.gpt2.hf_adapter import hf_config, to_hf_tensors
from megatron.errors import InputError
from megatron.inference.generation import PaddedBatch, generate_batch
from megatron.inference.prompts import gather_prompts, read_prompt_file, tokenize_prompts
from megatron.inference.sampling import SamplingParams, filter_logits, prompt_generators
from megatron.model.attention_spec import AttentionSpec
from megatron.model.gpt import GPTConfig, GPTModel
from megatron.model.gpt_config import model_config_of
from megatron.tokenizer.null_tokenizer import NullTokenizer
from tests.helpers.paths import FIXTURES

VOCAB, PADDED_VOCAB, EOD = 100, 128, 99
# A large init std makes the next-token distributions peaked, so greedy choices do not hinge on rounding.
MODEL = dict(vocab_size=PADDED_VOCAB, max_position_embeddings=48, num_layers=2, hidden_size=32, num_attention_heads=4,
             ffn_hidden_size=64, hidden_dropout=0.0, attention_dropout=0.0, init_method_std=0.5)
PROMPTS = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11, 12, 13, 14, 15, 16]]
GREEDY = SamplingParams()


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Models this small gain nothing from intra-op threads; on a busy machine the threads only contend."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return GPTModel(GPTConfig(**MODEL, init_seed=11)).eval()


def hf_model_of(model):
    from transformers import GPT2Config, GPT2LMHeadModel
    config = GPT2Config(**hf_config(model_config_of(model.config), VOCAB, torch.float32,
                                    {"bos_token_id": EOD, "eos_token_id": EOD}))
    hf_model = GPT2LMHeadModel._from_config(config, attn_implementation="eager")
    weights = dict(to_hf_tensors(model.state_dict(), model.config, VOCAB))
    with torch.no_grad():
        for name, parameter in hf_model.named_parameters():  # lm_head.weight is tied to wte: not listed
            parameter.copy_(weights.pop(name))
    assert not weights
    return hf_model.eval()


def generate(model, prompts, max_new_tokens=20, params=GREEDY, eod=EOD, indices=None, **options):
    generators = prompt_generators(params.seed, indices or range(len(prompts)))
    return generate_batch(model, prompts, max_new_tokens, params, generators, eod, VOCAB, **options)


def test_greedy_batch_equals_hf_generate_with_and_without_the_kv_cache(model):
    hf_model = hf_model_of(model)
    expected = []
    for prompt in PROMPTS:  # one at a time: no padding on the HF side
        output = hf_model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                   max_new_tokens=20, do_sample=False, eos_token_id=EOD, pad_token_id=EOD)
        expected.append(output[0, len(prompt):].tolist())
    assert generate(model, PROMPTS) == expected
    assert generate(model, PROMPTS, use_kv_cache=False) == expected
    assert len({len(row) for row in expected}) > 1 or all(len(row) == 20 for row in expected)


def test_sampling_is_reproducible_per_prompt_and_changes_with_the_seed(model):
    params = SamplingParams(greedy=False, temperature=0.9, top_k=40, top_p=0.95, seed=5)
    first = generate(model, PROMPTS, params=params)
    assert generate(model, PROMPTS, params=params) == first
    assert generate(model, PROMPTS, params=params, use_kv_cache=False) == first
    # A prompt's text depends on its seed and index only, not on the batch it is decoded in.
    assert generate(model, [PROMPTS[1]], params=params, indices=[1]) == [first[1]]
    other_seed = generate(model, PROMPTS, params=dataclasses.replace(params, seed=6))
    assert other_seed != first
    assert generate(model, PROMPTS) != first  # and sampling is not greedy decoding


def test_stops_after_the_end_of_document_token(model):
    free = generate(model, PROMPTS, eod=None)
    assert [len(row) for row in free] == [20, 20, 20]
    stop = free[0][3]
    stopped = generate(model, PROMPTS, eod=stop)
    for row, unstopped in zip(stopped, free):
        end = unstopped.index(stop) + 1 if stop in unstopped else 20
        assert row == unstopped[:end]
    assert stopped[0][-1] == stop and len(stopped[0]) <= 4


def test_padding_rows_of_the_vocabulary_are_never_chosen():
    torch.manual_seed(0)
    model = GPTModel(GPTConfig(**MODEL, init_seed=3)).eval()
    with torch.no_grad():  # make the padding rows the most likely "tokens" everywhere
        model.embedding.word_embeddings.weight[VOCAB:] = 50 * model.embedding.word_embeddings.weight[:1]
        model.embedding.word_embeddings.weight[VOCAB:] += 50 * model.final_layernorm.bias
    for params in (GREEDY, SamplingParams(greedy=False, seed=1)):
        assert max(max(row) for row in generate(model, PROMPTS, params=params, eod=None)) < VOCAB


def test_left_padding_positions_and_masks():
    batch = PaddedBatch.left_padded([[5, 6, 7], [8]], max_new_tokens=2, pad_id=0, device=torch.device("cpu"))
    assert batch.prompt_length == 3
    assert batch.tokens.tolist() == [[5, 6, 7, 0, 0], [0, 0, 8, 0, 0]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 4], [0, 0, 0, 1, 2]]
    # The padding is a document of its own: no real token sees it (model/attention_spec.py draws the masks).
    assert batch.segment_ids(4).tolist() == [[1, 1, 1, 1], [0, 0, 1, 1]]
    seen = AttentionSpec(segment_ids=batch.segment_ids(4)).allowed(4, 4, "cpu")
    assert seen[1, 0].int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]]
    assert seen[0, 0].int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    cached = AttentionSpec(segment_ids=batch.segment_ids(4)).allowed(1, 4, "cpu")  # one new query over the cache
    assert cached[1, 0].int().tolist() == [[0, 0, 1, 1]]
    unpadded = PaddedBatch.left_padded([[5, 6], [7, 8]], max_new_tokens=1, pad_id=0, device=torch.device("cpu"))
    assert unpadded.segment_ids(3) is None  # one stream: the kernels' mask-free causal path


def test_top_k_top_p_and_temperature_by_hand():
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    kept = lambda **options: filter_logits(logits, SamplingParams(greedy=False, **options)).isfinite()[0].tolist()
    assert kept(top_k=2) == [True, True, False, False]
    assert kept(top_p=0.7) == [True, True, False, False]  # 0.5 < 0.7, then 0.5 + 0.3 reaches it
    assert kept(top_p=0.5) == [True, False, False, False]
    assert kept(top_p=0.9) == [True, True, True, False]
    assert kept(top_p=1.0) == [True] * 4
    halved = filter_logits(logits, SamplingParams(greedy=False, temperature=2.0))
    assert torch.allclose(halved, logits / 2)


@pytest.mark.parametrize("options, flag", [(dict(temperature=0.0), "--temperature"), (dict(top_k=-1), "--top-k"),
                                           (dict(top_p=0.0), "--top-p"), (dict(top_p=1.5), "--top-p")])
def test_bad_sampling_flags(options, flag):
    with pytest.raises(InputError, match=flag):
        SamplingParams(greedy=False, **options)


# --- prompts ---------------------------------------------------------------------------------------------

def test_prompt_files_plain_and_jsonl(tmp_path):
    plain = tmp_path / "prompts.txt"
    plain.write_text("first prompt\n\n  second one\n")
    assert read_prompt_file(str(plain)) == ["first prompt", "  second one"]
    jsonl = tmp_path / "prompts.jsonl"
    jsonl.write_text("\n".join(json.dumps({"text": text, "id": i}) for i, text in enumerate(["a b", "{c}"])) + "\n")
    assert gather_prompts(["given"], str(jsonl)) == ["given", "a b", "{c}"]


@pytest.mark.parametrize("content, message", [
    ("", "contains no prompts"), ("\n  \n", "contains no prompts"),
    ('{"text": "ok"}\n{"text": \n', r"line 2: not valid JSON"),
    ('{"text": "ok"}\n{"prompt": "x"}\n', r'line 2: needs a string field "text"')])
def test_bad_prompt_files(tmp_path, content, message):
    path = tmp_path / "prompts.txt"
    path.write_text(content)
    with pytest.raises(InputError, match=message):
        read_prompt_file(str(path))


def test_missing_prompts_and_prompt_file():
    with pytest.raises(InputError, match="no prompt given"):
        gather_prompts([], None)
    with pytest.raises(InputError, match="--prompt-file /nonexistent/p.txt: cannot read"):
        gather_prompts([], "/nonexistent/p.txt")


def test_prompts_that_do_not_fit_or_are_empty():
    tokenizer = NullTokenizer(VOCAB - 1)
    assert tokenize_prompts(tokenizer, ["1 2 3", "4"], max_new_tokens=5, max_positions=8) == [[1, 2, 3], [4]]
    with pytest.raises(InputError, match=r"prompt 2 has 4 tokens; with --max-new-tokens 5 .* context of 8"):
        tokenize_prompts(tokenizer, ["1", "1 2 3 4"], max_new_tokens=5, max_positions=8)
    with pytest.raises(InputError, match="prompt 1 .* empty after tokenization"):
        tokenize_prompts(tokenizer, [" "], max_new_tokens=1, max_positions=8)
    with pytest.raises(InputError, match="--max-new-tokens 0"):
        tokenize_prompts(tokenizer, ["1"], max_new_tokens=0, max_positions=8)


def test_command_line_refuses_bad_input_before_loading_anything(tmp_path, capsys):
    from megatron.errors import run_cli
    from tools.generate_text import main
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    with pytest.raises(InputError, match=f"--prompt-file {empty} contains no prompts"):
        main(["--load", str(tmp_path), "--prompt-file", str(empty)])
    with pytest.raises(InputError, match=f"checkpoint directory {tmp_path / 'missing'} does not exist"):
        main(["--load", str(tmp_path / "missing"), "--prompt", "1"])
    with pytest.raises(InputError, match=f"{tmp_path} is not a checkpoint directory"):
        main(["--load", str(tmp_path), "--prompt", "1"])
    with pytest.raises(InputError, match=f"--output-json {empty} exists; pass --force"):
        main(["--load", str(tmp_path), "--prompt", "1", "--output-json", str(empty)])
    with pytest.raises(InputError, match=f"--output-json {tmp_path / 'no' / 'out.jsonl'}: directory {tmp_path / 'no'} "
                                         "does not exist; create it or choose another path"):
        main(["--load", str(tmp_path), "--prompt", "1", "--output-json", str(tmp_path / "no" / "out.jsonl")])
    with pytest.raises(SystemExit) as exit_info:
        run_cli(main, ["--load", str(tmp_path / "missing"), "--prompt", "1"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.startswith(f"error: checkpoint directory {tmp_path / 'missing'} does not exist")


def test_upstreams_model_flags_are_accepted_and_checked_against_the_checkpoint():
    """Upstream's generate_samples_gpt.py command lines give the model's shape; the checkpoint here is the Megatron
    layout upstream's deepspeed_to_megatron.py wrote (tests/fixtures/README.md): 2 layers, hidden 16, 2 heads, 16."""
    import os

    from megatron.inference.command_line import tokenizer_from_flags
    from tasks.zeroshot_gpt.evaluate import parse_args as evaluation_flags
    from tools.generate_text import main, parse_args

    load = os.path.join(FIXTURES, "checkpoints", "megatron_tp1pp1")
    shape = ["--num-layers", "2", "--hidden-size", "16", "--num-attention-heads", "2", "--max-position-embeddings",
             "16"]
    tokenizer, recorded = tokenizer_from_flags(parse_args(["--load", load, "--prompt", "1", *shape, "--seq-length",
                                                           "16"]))
    assert tokenizer.vocab_size == 41 and recorded["num_layers"] == 2
    with pytest.raises(InputError, match=r"^--hidden-size 32 differs from the checkpoint's 16 \(--load .*\); give"):
        main(["--load", load, "--prompt", "1", "--hidden-size", "32"])
    with pytest.raises(InputError, match=r"^--seq-length 8 differs from the checkpoint's 16"):
        main(["--load", load, "--prompt", "1", "--seq-length", "8"])
    # Zero-shot evaluation's --seq-length is its window, which may be shorter than training's.
    tokenizer_from_flags(evaluation_flags(["--load", load, "--task", "LAMBADA", "--valid-data", "x", *shape,
                                           "--seq-length", "8"]))
