"""Training a GPT-2-style byte-level BPE vocabulary (vocab.json + merges.txt) from a stream of texts,
for corpora that GPT-2's own vocabulary fits badly or when its files cannot be downloaded."""
import os
import shutil
import tempfile

from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from megatron.errors import InputError
from megatron.tokenizer.gpt2_bpe import EOD_TOKEN, GPT2BPETokenizer

VOCAB_FILE = "vocab.json"
MERGES_FILE = "merges.txt"
MIN_VOCAB_SIZE = 257  # the 256 byte tokens and <|endoftext|>


def train_bpe_vocab(texts, vocab_size, output_dir):
    """Train on `texts` (any iterable, consumed once, never held in memory as a whole) and write
    output_dir/vocab.json and output_dir/merges.txt in GPT-2's format; returns their paths.

    Same settings as GPT-2: byte-level alphabet of all 256 bytes (so any text can be encoded), GPT-2's
    split pattern, no prefix space; "<|endoftext|>" is in the vocab for the end-of-document id. The
    files are checked by loading them with GPT2BPETokenizer before they replace any existing ones.
    """
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < MIN_VOCAB_SIZE:
        raise InputError(f"--vocab-size {vocab_size!r}: must be an integer >= {MIN_VOCAB_SIZE} "
                         f"(256 byte tokens + {EOD_TOKEN}, then one token per merge)")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOD_TOKEN], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer=trainer)

    os.makedirs(output_dir, exist_ok=True)
    staging_dir = tempfile.mkdtemp(prefix=".bpe-vocab-", dir=output_dir)
    try:
        tokenizer.model.save(staging_dir)
        GPT2BPETokenizer(os.path.join(staging_dir, VOCAB_FILE), os.path.join(staging_dir, MERGES_FILE))
        # Each file appears whole or not at all. Merges go first: should the process die between the two
        # renames, new merges usually name tokens an old vocab.json lacks, so loading fails loudly.
        for name in (MERGES_FILE, VOCAB_FILE):
            os.replace(os.path.join(staging_dir, name), os.path.join(output_dir, name))
    finally:
        shutil.rmtree(staging_dir, ignore_errors=True)
    return os.path.join(output_dir, VOCAB_FILE), os.path.join(output_dir, MERGES_FILE)
