"""Zero-shot evaluation of a trained GPT on local files: WikiText-103 word-level perplexity and LAMBADA
last-word accuracy (upstream Megatron's task names and metrics)."""
