"""Checkpoints written for another layout: target_writer cuts a model (and its Adam state) into a target TP x PP
(x EP) with DeepSpeed's universal files (universal_files) and the ZeRO-0 forms (bf16_slices,
expert_zero_partitions); conversions puts reading and writing together (reshape). (Synthetic sources of every
layout for the tests and benchmarks: tools/fixtures/checkpoint_sources.py.)"""
