"""Megatron-compatible GPT pre-training on the DeepSpeed engine.

Importing this package is cheap: submodules are imported by whoever needs them.
"""
