"""Megatron-DeepSpeed's flags, one module per group. Each group owns its flags (`add_flags`), their checks and
the values they derive (functions that return new values, never changing what they are given), and the builder of
its section of the JobConfig (`section`); `LIMITS` and `PRESET_DEFAULTS` state its required flags, numeric ranges
and the defaults a --model-size preset may replace. unsupported.py holds, as data, the upstream flags deliberately
not supported; inference.py the flags of generation and evaluation, which are these groups' flags.
megatron/config/arguments.py puts the groups together in order."""
