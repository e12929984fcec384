"""Checkpoints as portable artefacts, outside the trainer: read one written at any layout into the
single-process GPTModel's state dict (reader), cut it into another layout (writer), and move it to and from
Hugging Face's GPT2LMHeadModel (hf). Everything here runs in one CPU process without torch.distributed."""
