"""Text generation with a trained GPT: KV cache, sampling, batched decoding over tensor x data parallelism,
loading a checkpoint at any tensor-parallel size."""
