"""The generated reference pages of docs/: every flag (from the parsers themselves) and every one-line error
(from the source). tools/write_reference.py writes them; a test fails when the committed pages differ."""
