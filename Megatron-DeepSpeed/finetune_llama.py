"""Fine-tune a model on prompts and answers (upstream Megatron-DeepSpeed main's finetune_llama.py and the flags of
its examples_deepspeed/finetune_hf_llama/finetune_llama.sh). Usually from a Hugging Face import with --finetune:
    python tools/convert_checkpoint.py --from-hf ./Llama-2-7b-hf --save ./llama-tp2pp2 \\
        --target-tensor-parallel-size 2 --target-pipeline-parallel-size 2
    torchrun --nproc_per_node 4 finetune_llama.py --load ./llama-tp2pp2 --finetune --data-path alpaca_data.json \\
        --tokenizer-type HFTokenizer --tokenizer-model ./Llama-2-7b-hf ... (the model flags of the checkpoint)
The data: Alpaca JSON, prompt/completion or chat (messages, ShareGPT conversations) rows, or their preprocessed
files (tools/preprocess_sft_data.py); the loss is on the answers only (docs/fine-tuning.md).
"""
from megatron.errors import run_cli


def main(argv=None):
    from deepspeed_npu import activate  # as pretrain_gpt.py: the NPU and its kernels where there is one
    npu = activate()
    from megatron.data.sft_data import SupervisedData
    from megatron.model.provider import model_provider
    from megatron.training.loop import pretrain
    return pretrain(model_provider, argv, adaptor_kernels=npu.kernels, data=SupervisedData())


if __name__ == "__main__":
    run_cli(main)
