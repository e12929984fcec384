"""Sentence splitting without a downloaded model (megatron/data/sentence_splitter.py): ends at '.', '!' or '?'
before a capital, digit or opening quote, never after an abbreviation or an initial; --keep-newlines keeps the
newlines between sentences so the pieces join back into the paragraphs."""
import pytest

from megatron.data.sentence_splitter import split_sentences


@pytest.mark.parametrize("text, sentences", [
    ("It rained. Then it stopped! Did it? Yes.", ["It rained.", "Then it stopped!", "Did it?", "Yes."]),
    ('He said "stop." Then he left.', ['He said "stop."', "Then he left."]),
    ("Prices rose (a lot.) 2020 was worse.", ["Prices rose (a lot.)", "2020 was worse."]),
    ("Dr. Smith met Mr. Jones e.g. Today. J. R. R. Tolkien wrote.", ["Dr. Smith met Mr. Jones e.g. Today.",
                                                                      "J. R. R. Tolkien wrote."]),
    ("version 3.11 is out. lower case follows. No split", ["version 3.11 is out. lower case follows.", "No split"]),
    ("   \n ", []),
])
def test_boundaries(text, sentences):
    assert split_sentences(text) == sentences


def test_keep_newlines_keeps_the_paragraphs():
    text = "First one. Second one.\n\nNew paragraph."
    pieces = split_sentences(text, keep_newlines=True)
    assert pieces == ["First one.", "Second one.\n\n", "New paragraph."]
    assert split_sentences(text) == ["First one.", "Second one.", "New paragraph."]
