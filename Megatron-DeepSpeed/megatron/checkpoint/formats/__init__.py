"""The checkpoint layouts a user may bring, read in one CPU process. detect decides once what a checkpoint directory
holds (its Layout and the kind of its weights); locate finds it from the pointer files. One module per source
format reads its weights as units (weight_units) and, where the format keeps its own, its Adam state:
pipeline_engine, plain_engine (with DeepSpeed's expert files), megatron, universal (per-parameter files), zero3.
reader.read_checkpoint looks the kind's units up; optimizer_state.read_optimizer_state assembles the Adam state
(DeepSpeed's ZeRO 0-2 files through zero0 and zero12, with mixed_precision_state for the fp16/bf16 wrappers'
forms and expert_optimizer_state for MoE's per-expert-parallel-rank files). checkpoint holds what they hand on."""
