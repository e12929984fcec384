"""What every tokenizer's tests share: texts that exercise the odd corners of text (quotes, numbers, whitespace,
scripts, emoji, the literal end-of-text token, control characters), and the check that the batch path gives the
single-text path's ids, also from several threads at once."""
from concurrent.futures import ThreadPoolExecutor

import numpy as np

VARIED_TEXTS = [
    "",
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "I'm sure you're right; it's what we'd do, they'll see, I've won. DON'T 'S 'sup",
    "numbers: 0 12 345 6789 3.14159 1e-10 0xDEADBEEF 1,000,000 ١٢٣ Ⅻ",
    "spaces:  two   three    four\tone tab\t\ttwo tabs\n\nnewlines\r\nCRLF \n \n trailing   ",
    "   leading spaces and a lonely space at the end ",
    "\n\n\n",
    "unicode: Größe naïve café Ελληνικά Привет 日本語の文章 한국어 עברית العربية",
    "emoji: 😀🎉 👍🏽 🇩🇪🇫🇷 👨‍👩‍👧‍👦 and a zero-width joiner\u200d and\u00a0nbsp",
    "literal <|endoftext|> in the middle, and<|endoftext|>glued, <|endoftext|>",
    "<|endoftext|>",
    "code: def f(x):\n    return {'a': [1, 2]} # comment\n",
    "control \x00\x01\x1f\x7f and combining e\u0301 a\u0308",
]



def assert_batch_matches_single(tokenizer, texts):
    """tokenize_batch == tokenize per text, sequentially and from several threads at once."""
    expected = [tokenizer.tokenize(text) for text in texts]
    ids, lengths = tokenizer.tokenize_batch(texts)
    assert ids.ndim == 1 and np.issubdtype(ids.dtype, np.integer) and lengths.dtype == np.int64
    assert lengths.tolist() == [len(e) for e in expected]
    assert ids.tolist() == [i for e in expected for i in e]

    chunks = [texts[i::3] for i in range(3)] * 4
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(tokenizer.tokenize_batch, chunks))
    for chunk, (chunk_ids, chunk_lengths) in zip(chunks, results):
        assert chunk_ids.tolist() == [i for text in chunk for i in tokenizer.tokenize(text)]
        assert chunk_lengths.tolist() == [len(tokenizer.tokenize(text)) for text in chunk]
