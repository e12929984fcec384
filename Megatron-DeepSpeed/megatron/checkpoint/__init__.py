"""Everything about checkpoints. The trainer's side: save_load (DeepSpeed checkpoints plus our client state), guard
(start-up checks of --load/--save), resume (what --load restores). The portable side, in one CPU process without
torch.distributed: read one written at any layout into the single-process GPTModel's state dict (directory: its files
and layout; weight_units: weights read unit by unit; reader: one unit builder per layout), cut it into another layout
(writer), and move it to and from Hugging Face's GPT2LMHeadModel (hf). layout.py spells the names of a checkpoint's
files and keys for both."""
