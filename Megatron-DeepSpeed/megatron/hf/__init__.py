"""Hugging Face interop: a transformers directory's files (files), read as one of our models through its
family's adapter (directory), exported from and imported into checkpoints (conversions), and shown beside our
checkpoints (examine)."""
