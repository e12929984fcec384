"""Pre-train a GPT model (Megatron-DeepSpeed's flags). Single process:
    python pretrain_gpt.py --num-layers 2 --hidden-size 64 ... --data-path data/demo_text_document ...
Several processes: torchrun --nproc_per_node N pretrain_gpt.py ... (or the deepspeed launcher).
"""
from megatron.errors import run_cli
from megatron.model.gpt import GPTConfig, GPTModel


def model_provider(args, padded_vocab_size: int) -> GPTModel:
    return GPTModel(GPTConfig(
        vocab_size=padded_vocab_size, max_position_embeddings=args.max_position_embeddings,
        num_layers=args.num_layers, hidden_size=args.hidden_size, num_attention_heads=args.num_attention_heads,
        ffn_hidden_size=args.ffn_hidden_size, hidden_dropout=args.hidden_dropout,
        attention_dropout=args.attention_dropout, init_method_std=args.init_method_std,
        openai_gelu=args.openai_gelu, checkpoint_activations=args.checkpoint_activations))


def main(argv=None):
    from megatron.training import pretrain
    pretrain(model_provider, argv)


if __name__ == "__main__":
    run_cli(main)
