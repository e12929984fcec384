"""finetune_llama.py's data: one --data-path of fine-tuning rows (a .json / .jsonl file, rendered at start-up as
upstream reads its Alpaca file) or of preprocessed examples, split by --split into contiguous runs of examples,
each split's samples padded or packed (sft_dataset) and batched with the examples' loss mask (sft_batch)."""
import torch.distributed as dist

from megatron.config.job import JobConfig
from megatron.data.data_loaders import train_valid_test_num_samples
from megatron.data.sft_batch import SFTBatchMaker
from megatron.data.sft_dataset import (TOKENS_SUFFIX, ExampleList, IndexedExamples, PackedExamples, PaddedExamples,
                                       collect, is_raw_rows, iter_rows, read_examples)
from megatron.data.sft_examples import ExampleRenderer
from megatron.data.splits import split_boundaries
from megatron.data.token_range import check_token_ids
from megatron.errors import InputError


def renderer_for(tokenizer) -> ExampleRenderer:
    """Rows rendered with the training tokenizer (chat rows with its chat template, where it has one)."""
    return ExampleRenderer(tokenizer.tokenize, tokenizer.eod, getattr(tokenizer, "chat_template_tokenizer", None))


def pad_id(tokenizer) -> int:
    """The tokenizer's pad token where it names one, else its end of document (sft_dataset says why either is
    right)."""
    pad = getattr(tokenizer, "pad", None)
    return tokenizer.eod if pad is None else pad


class ExampleRange:
    """Examples [start, end) of a larger set (one split)."""

    def __init__(self, examples, start: int, end: int):
        self.examples, self.start, self.end = examples, start, end

    def __len__(self) -> int:
        return self.end - self.start

    def __getitem__(self, index: int):
        return self.examples[self.start + index]

    def lengths(self):
        return self.examples.lengths()[self.start:self.end]


def load_examples(config: JobConfig, tokenizer, vocab_size: int):
    """The examples of --data-path, each bad, truncated-away or dropped row reported by rank 0 in a line."""
    data = config.data
    if data.split_data_paths or len(data.data_path) != 1:
        given = " ".join(data.data_path) or "(none)"
        raise InputError(f"--data-path {given}: fine-tuning reads one --data-path, a .json / .jsonl file of rows or "
                         "the --output-prefix of tools/preprocess_sft_data.py")
    path = data.data_path[0]
    if not is_raw_rows(path):
        examples = IndexedExamples(path)
        check_token_ids([path + TOKENS_SUFFIX], vocab_size, data.data_cache_path)
        return examples
    speaks = not dist.is_initialized() or dist.get_rank() == 0
    say = print if speaks else (lambda line: None)
    examples, report = collect(read_examples(iter_rows(path), renderer_for(tokenizer), data.seq_length,
                                             data.overlong_examples, say, vocab_size))
    say(report.summary(path))
    if not examples:
        raise InputError(f"--data-path {path}: no usable example (every row was reported above); give rows of one "
                         "of the formats in docs/fine-tuning.md")
    return ExampleList(examples)


class SupervisedData:
    """The data of a fine-tuning run, as training/loop.py asks for it; the examples are read once a run (the
    loop asks again for the evaluation after training)."""

    def __init__(self):
        self.examples = None

    def datasets(self, config: JobConfig, tokenizer, vocab_size: int) -> tuple:
        """(train, valid, test) datasets of samples; a split without examples or samples to give is None."""
        if self.examples is None:
            self.examples = load_examples(config, tokenizer, vocab_size)
        examples = self.examples
        bounds = split_boundaries(config.data.split, len(examples))
        kind = PackedExamples if config.data.pack_sequences else PaddedExamples
        datasets = tuple(kind(ExampleRange(examples, start, end), config.data.seq_length + 1, pad_id(tokenizer), count)
                         if end > start and count else None
                         for start, end, count in zip(bounds, bounds[1:], train_valid_test_num_samples(config)))
        if datasets[0] is None:
            raise InputError(f"--split {config.data.split!r} leaves the train split of {len(examples)} examples empty; "
                             "give train a share (upstream's finetune_llama.sh: 100,0,0)")
        return datasets

    def batch_maker(self, config: JobConfig, tokenizer, sequence_chunk: tuple) -> SFTBatchMaker:
        return SFTBatchMaker(config.data.pack_sequences, sequence_chunk)
