"""Everything about checkpoints, in rooms by what they serve:

  trainer/   what the training loop calls: start-up checks, the resume plan, save and load
  formats/   the layouts a checkpoint may have: detected once (formats/detect.py), read into the single-process
             GPTModel's weights and Adam state
  reshape/   writing another layout (target_writer, universal files)
  the files themselves (here): file_names (every file and key name), parameter_names (GPTModel's names in each
  layout), client_state, pointers, manifest, trust, torch_files (the one torch.load and torch.save),
  tensor_records, shards (split dimensions).
Lower rooms never import higher ones: the files, then formats/, then reshape/, then trainer/. Hugging Face
directories are megatron/hf/'s, the recorded flags' typed view config/recorded_flags's, the --save lock
files/save_dir_lock's."""
