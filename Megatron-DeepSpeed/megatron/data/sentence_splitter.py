"""Rule-based English sentence splitting that needs no downloaded model.

Megatron's tool uses NLTK's punkt model, which must be downloaded at run time; this project never
downloads. The rules: a sentence ends at '.', '!' or '?' (plus closing quotes or brackets) followed by
whitespace and a capital letter, digit or opening quote, unless the word before the period is a known
abbreviation or a single initial. Boundaries can therefore differ from punkt's on unusual text.
"""
import re

ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof sr jr st vs etc e.g i.e cf al fig eq no vol approx dept est inc ltd co corp "
    "jan feb mar apr jun jul aug sep sept oct nov dec u.s u.k".split()
)
_BOUNDARY = re.compile(r"""[.!?]+["')\]]*(?P<gap>\s+)(?=["'(\[]?[A-Z0-9])""")
_LAST_WORD = re.compile(r"(\S+)$")


def split_sentences(text: str, keep_newlines: bool = False) -> list[str]:
    """Split `text` into sentences. The whitespace between two sentences is dropped, except that with
    `keep_newlines` the newlines in it stay at the end of the earlier sentence (Megatron's
    --keep-newlines), so that joining the pieces keeps the paragraph structure. Blank text has no
    sentences."""
    sentences = []
    start = 0
    for match in _BOUNDARY.finditer(text):
        if _is_abbreviation(text[start:match.start("gap")]):
            continue
        end = match.start("gap")
        piece = text[start:end]
        if keep_newlines:
            piece += "\n" * match.group("gap").count("\n")
        sentences.append(piece)
        start = match.end("gap")
    sentences.append(text[start:])
    return [sentence for sentence in sentences if sentence.strip()]


def _is_abbreviation(sentence: str) -> bool:
    word = _LAST_WORD.search(sentence)
    if word is None or not word.group(1).endswith("."):
        return False
    token = word.group(1).rstrip(".").lstrip("(\"'").lower()
    return token in ABBREVIATIONS or (len(token) == 1 and token.isalpha())
