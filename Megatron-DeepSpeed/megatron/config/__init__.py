"""What a job is, before anything runs: Megatron's command line (arguments, flag groups, presets), the frozen
typed JobConfig built from it, the learning-rate and batch-size schedules, the DeepSpeed JSON derived from it, and
the flags a checkpoint recorded, read back typed (recorded_flags)."""
