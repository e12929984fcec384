#!/usr/bin/env bash
# Supervised fine-tuning: a Hugging Face model in, finetune_llama.py on prompt/answer rows, a Hugging Face model out.
#
#   bash test/finetune_llama_8p.sh                  # CPU: a tiny demo Llama and Alpaca rows built locally, TP2 x PP2 x DP2
#   bash test/finetune_llama_8p.sh --hf_model=./Llama-2-7b-hf --data_path=alpaca_data.json --seq_length=512  # 8 devices
#
# Options: --hf_model=DIR --data_path=ROWS_OR_PREFIX --tp=N --pp=N --train_iters=N --seq_length=N
#   --micro_batch_size=N --global_batch_size=N --nproc=N --device=auto|cuda|npu|cpu --output_dir=DIR
#   any finetune_llama.py flag (with dashes) is passed through, e.g. --pack-sequences --lr 1e-5
# The import, train.log, run.json, checkpoints, loss_curve.png and hf/ (the export) go to test/output/<run>/.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[ ! -f "$root/test/env_npu.sh" ] || ! command -v npu-smi >/dev/null 2>&1 || source "$root/test/env_npu.sh"
python=$(bash "$root/Megatron-DeepSpeed/tools/setup_env.sh")
exec "$python" "$root/Megatron-DeepSpeed/tools/launch_finetune.py" "$@"
