"""Model families: one folder per family (gpt2/, llama/, ...) holding its Hugging Face adapter (hf_adapter.py,
the HFAdapter protocol of adapter.py), its presets (presets.py) and the model flags its models have by
definition, described by one Family (family.py) and listed once in registry.FAMILIES.

Families sit below config/: they import only torch, megatron.errors and each other's shared modules, so the
flag groups and the preset table can read them. Our model flags reach an adapter as config/model_config's
ModelConfig and model/gpt.py's GPTConfig, read by their fields (the protocols of adapter.py); an adapter returns
the flags of an imported model, which hf/ turns into a ModelConfig."""
