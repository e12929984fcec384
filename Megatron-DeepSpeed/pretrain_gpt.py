"""Pre-train a GPT model (Megatron-DeepSpeed's flags). Single process:
    python pretrain_gpt.py --num-layers 2 --hidden-size 64 ... --data-path data/demo_text_document ...
Several processes: torchrun --nproc_per_node N pretrain_gpt.py ... (or the deepspeed launcher).
As in Megatron-DeepSpeed, the model runs on DeepSpeed's pipeline engine (any --pipeline-model-parallel-size,
1 included); --no-pipeline-parallel trains the plain model on DeepSpeed's plain engine instead.
"""
from megatron.errors import run_cli


def main(argv=None):
    # On an Ascend host the deepspeed_npu adaptor selects the NPU and hccl before DeepSpeed is imported, and
    # offers its fused kernels; elsewhere it does nothing. It patches nothing.
    from deepspeed_npu import activate
    npu = activate()
    from megatron.model.provider import model_provider
    from megatron.training.loop import pretrain
    pretrain(model_provider, argv, adaptor_kernels=npu.kernels)


if __name__ == "__main__":
    run_cli(main)
