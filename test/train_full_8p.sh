#!/usr/bin/env bash
# Full training run: trains a GPT to the preset's length, evaluates, saves checkpoints.
#
#   bash test/train_full_8p.sh                      # CPU: tiny preset on the embedded demo data, TP2 x PP2 x DP2
#   bash test/train_full_8p.sh --model_size=1.3B --data_path=data/   # 8 GPUs / NPUs
#
# Options: --model_size=345M|1.3B|2.7B|3.7B|345M_without_mp|125M_MoE64|1.3B_MoE128|tiny|llama2-7B|llama2-13B|
#          llama3-8B|tinyllama-1.1B|llama-tiny|llama3.1-8B|llama3.2-1B|llama3.2-3B|llama3.1-tiny
#          --data_path=PREFIX_OR_DIR  --train_iters=N
#   --device=auto|cuda|npu|cpu  --nproc=N  --vocab_file=F --merge_file=F | --tokenizer_model=F
#   --ds_sequence_parallel_size=N (DeepSpeed-Ulysses; with --tensor-model-parallel-size 1
#     --pipeline-model-parallel-size 1 --no-pipeline-parallel)
#   multi-node: --nnodes=N --node_rank=I --master_addr=HOST [--master_port=P] (run on every node)
#   any Megatron flag (with dashes) is passed to pretrain_gpt.py, e.g. --zero-stage 1 --bf16
# Logs, run.json, checkpoints and loss_curve.png go to test/output/<run>/; the last three lines are the summary.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# On an Ascend host: CANN (unless already loaded), task queue and PYTHONPATH; env_npu.sh keeps what is set.
[ ! -f "$root/test/env_npu.sh" ] || ! command -v npu-smi >/dev/null 2>&1 || source "$root/test/env_npu.sh"
python=$(bash "$root/Megatron-DeepSpeed/tools/setup_env.sh")
exec "$python" "$root/Megatron-DeepSpeed/tools/launch_training.py" --run full "$@"
