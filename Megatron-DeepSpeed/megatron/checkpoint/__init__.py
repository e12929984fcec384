"""Everything about checkpoints, in rooms by what they serve:

  trainer/   what the training loop calls: start-up checks, the --save lock, the resume plan, save and load
  formats/   the layouts a checkpoint may have: detected once (formats/detect.py), read into the single-process
             GPTModel's weights and Adam state
  reshape/   writing another layout (target_writer, universal files)
  hf/        Hugging Face directories: their files, export and import through megatron/families/' adapters, examine
  the files themselves (here): file_names (every file and key name), parameter_names (GPTModel's names in each
  layout), recorded_flags (the flags a checkpoint records, typed), client_state, pointers, manifest, trust,
  torch_files (the one torch.load and torch.save), tensor_records, shards (split dimensions).
Lower rooms never import higher ones: the files, then formats/, then reshape/, then hf/, then trainer/."""
