"""Test material for the tokenizers: an independent, deliberately slow GPT-2 byte-level BPE encoder (the
oracle) and a small real-text corpus to train vocabularies on.

The encoder follows the classic published algorithm step by step (regex split, byte -> printable
character table, repeatedly merge the adjacent pair with the lowest merge rank) and shares no code with
megatron.tokenizer, so a bug there cannot hide in both."""
import importlib
import inspect
import json

import regex

GPT2_SPLIT = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")


def byte_to_char_table():
    """GPT-2's reversible byte -> character map: printable Latin-1 bytes map to themselves, the other
    68 bytes to the code points 256, 257, ... in byte order."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    table = {}
    extra = 0
    for byte in range(256):
        if byte in printable:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(256 + extra)
            extra += 1
    return table


class ReferenceGPT2Encoder:
    def __init__(self, vocab_path, merges_path):
        with open(vocab_path, encoding="utf-8") as f:
            self.vocab = json.load(f)
        with open(merges_path, encoding="utf-8") as f:
            lines = f.read().split("\n")
        if lines and lines[0].startswith("#version"):
            lines = lines[1:]
        pairs = [tuple(line.split()) for line in lines if line.strip()]
        self.rank_of_pair = {pair: rank for rank, pair in enumerate(pairs)}
        self.byte_to_char = byte_to_char_table()

    def _merge_word(self, word):
        parts = list(word)
        while len(parts) > 1:
            candidates = [(self.rank_of_pair[pair], pair) for pair in zip(parts, parts[1:])
                          if pair in self.rank_of_pair]
            if not candidates:
                break
            _, (first, second) = min(candidates)
            merged = []
            i = 0
            while i < len(parts):
                if i + 1 < len(parts) and parts[i] == first and parts[i + 1] == second:
                    merged.append(first + second)
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            parts = merged
        return parts

    def encode(self, text):
        ids = []
        for piece in GPT2_SPLIT.findall(text):
            word = "".join(self.byte_to_char[b] for b in piece.encode("utf-8"))
            ids.extend(self.vocab[part] for part in self._merge_word(word))
        return ids


CORPUS_MODULES = ("argparse", "collections", "csv", "datetime", "decimal", "email.message", "fractions",
                  "functools", "http.client", "inspect", "itertools", "json", "logging", "os", "pathlib",
                  "random", "re", "shutil", "statistics", "string", "subprocess", "tarfile", "tempfile",
                  "textwrap", "threading", "unittest", "zipfile")
NON_ENGLISH = ("Größe überprüfen, naïve Café-Bücher für 12,50 €.", "日本語の文章を分割します。東京は晴れ。",
               "Привет, мир! Это проверка токенизатора.", "Ελληνικά γράμματα και αριθμοί ١٢٣ ٤٥٦.",
               "emoji 😀🎉👍🏽 and flags 🇩🇪🇫🇷 in text", "tabs\tand\r\nwindows lines\u00a0nbsp")


def docstring_corpus():
    """About 180 kB of English prose (stdlib docstrings, fixed for a given Python) plus some non-English
    lines repeated often enough that merges form inside multi-byte characters."""
    texts = list(NON_ENGLISH) * 20
    for name in CORPUS_MODULES:
        module = importlib.import_module(name)
        texts.append(module.__doc__ or "")
        for attr, value in sorted(vars(module).items()):
            defined_here = getattr(value, "__module__", None) == name
            if not attr.startswith("_") and defined_here and (inspect.isclass(value) or inspect.isfunction(value)):
                texts.append(value.__doc__ or "")
    return texts
