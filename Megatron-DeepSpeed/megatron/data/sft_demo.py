"""The fine-tuning demo's inputs, made here without a download: Alpaca rows from the standard library's docstrings
(demo_corpus) and a tiny Hugging Face Llama (random weights, a BPE tokenizer trained on the same docstrings, a chat
template), so the CPU entry script runs the whole path: Hugging Face in, fine-tune, Hugging Face out."""
import itertools
import json
import os

from megatron.data.demo_corpus import iter_stdlib_docstrings

DEMO_INSTRUCTION = "Continue this piece of Python documentation."
# A template in the usual form: each turn a header then its text and EOS; the generation prompt is the header.
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{{ m['role'] + ':' }}{{ ' ' + m['content'] + eos_token }}"
                 "{% endfor %}{% if add_generation_prompt %}{{ 'assistant:' }}{% endif %}")


def demo_rows(count: int, max_chars: int = 160) -> list:
    """Alpaca rows: a docstring's first line as the input, its next line as the output."""
    rows = []
    for text in iter_stdlib_docstrings():
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        if len(lines) >= 2:
            rows.append({"instruction": DEMO_INSTRUCTION, "input": lines[0][:max_chars], "output": lines[1][:max_chars]})
        if len(rows) == count:
            break
    return rows


def write_demo_llama(directory: str, vocab_size: int = 1024, seq_length: int = 256, seed: int = 0) -> str:
    """A tiny LlamaForCausalLM (2 layers, hidden 64) and its tokenizer saved in `directory`."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer, tokenizer.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
    tokenizer.train_from_iterator(itertools.islice(iter_stdlib_docstrings(), 2000),
                                  trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"],
                                                      show_progress=False))
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    os.makedirs(directory, exist_ok=True)
    tokenizer.save(os.path.join(directory, "tokenizer.json"))
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as handle:
        json.dump({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "chat_template": CHAT_TEMPLATE,
                   "tokenizer_class": "PreTrainedTokenizerFast"}, handle)
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=tokenizer.get_vocab_size(), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                         max_position_embeddings=seq_length, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2,
                         tie_word_embeddings=False)
    LlamaForCausalLM(config).save_pretrained(directory)
    return directory
