#!/usr/bin/env bash
# One command for a GPU or NPU host (or a CPU, reduced): correctness and speed of training on this device.
#   bash Megatron-DeepSpeed/tools/device_check.sh [--cpu] [--iterations N] [--output report.md]
# Uses the project's .venv when set up, else this host's python3 (e.g. a PyTorch-with-CUDA image). On a host
# without network where DeepSpeed or the tokenizer packages are missing, put their wheels in <repo>/.whl
# (pip download --no-deps ... on a connected machine): they are installed from there into a private folder.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# On an Ascend host, as the entry scripts do: CANN (unless already loaded), task queue and PYTHONPATH.
[ ! -f "$root/test/env_npu.sh" ] || ! command -v npu-smi >/dev/null 2>&1 || source "$root/test/env_npu.sh"
python=${PYTHON:-$([ -x "$root/.venv/bin/python" ] && echo "$root/.venv/bin/python" || echo python3)}
needed="import torch, deepspeed, numpy, regex, tiktoken, safetensors"
# Probed without DS_ACCELERATOR: DeepSpeed would try that accelerator at import, which deepspeed_npu reports better.
if ! env -u DS_ACCELERATOR "$python" -c "$needed" >/dev/null 2>&1; then
  if ! ls "$root"/.whl/*.whl >/dev/null 2>&1; then
    echo "error: $python cannot import torch, deepspeed and the tokenizer packages; run" \
         "Megatron-DeepSpeed/tools/setup_env.sh, or put their wheels in $root/.whl" >&2
    exit 2
  fi
  site=${TMPDIR:-/tmp}/megatron-device-check-site
  echo "installing the wheels in $root/.whl into $site" >&2
  "$python" -m pip install -q --no-index --no-deps --no-compile --target "$site" "$root"/.whl/*.whl
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
# The repository's packages, whether or not set-up installed them into this python.
export PYTHONPATH="$root/Megatron-DeepSpeed:$root/DeepSpeed${PYTHONPATH:+:$PYTHONPATH}"
exec "$python" "$root/Megatron-DeepSpeed/tools/device_check.py" "$@"
