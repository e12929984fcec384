#!/usr/bin/env bash
# Idempotent environment set-up: a virtual environment at $MEGATRON_VENV (default <repo>/.venv) that
# sees the system's site-packages, so a torch (+ torch_npu) the user already has is reused, never replaced, even
# when it fails to import (then set-up stops and says why: deepspeed_npu/torch_install.py). Without a torch, a
# CPU build is installed on machines without an accelerator, torch 2.13.0 on NVIDIA hosts, none on Ascend hosts.
# Usage: bash Megatron-DeepSpeed/tools/setup_env.sh [--tests] [--extras]   (prints the venv's python path last)
#   --extras: the optional integrations (W&B, lm-evaluation-harness; pyproject.toml's extras), never needed to
#   train; --tests: the test suite's requirements, and the extras, which it tests.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# On an Ascend host, CANN's environment first: without it `import torch` fails (it loads torch_npu).
[ ! -f "$root/test/env_npu.sh" ] || ! command -v npu-smi >/dev/null 2>&1 || source "$root/test/env_npu.sh"
venv=${MEGATRON_VENV:-$root/.venv}
python=${PYTHON:-python3}
requirements=("$root/requirements.txt")
extras=("$root/requirements-wandb.txt" "$root/requirements-eval.txt")
for option in "$@"; do
  case "$option" in
    --tests) requirements+=("$root/Megatron-DeepSpeed/tests/requirements.txt") ;&
    --extras) requirements+=("${extras[@]}") ;;
    *) echo "setup: unknown option $option (use --tests, --extras)" >&2; exit 2 ;;
  esac
done
mapfile -t requirements < <(printf '%s\n' "${requirements[@]}" | awk '!seen[$0]++')  # --tests --extras: once

# One stamp per set of requirement files and their contents: an unchanged set is not installed again.
stamp="$venv/.setup-$(cat "${requirements[@]}" "$root/pyproject.toml" | sha256sum | cut -c1-16)"
if [ -x "$venv/bin/python" ] && [ -f "$stamp" ]; then
  echo "$venv/bin/python"
  exit 0
fi

log="$venv/setup.log"
say() { echo "setup: $*" >&2; }
pip_install() {
  if ! "$venv/bin/python" -m pip install --disable-pip-version-check "$@" >>"$log" 2>&1; then
    say "pip install $* failed; the last lines of $log:"
    tail -n 25 "$log" >&2
    exit 1
  fi
}

if [ ! -x "$venv/bin/python" ]; then
  say "creating virtual environment $venv (with system site-packages)"
  "$python" -m venv --system-site-packages "$venv"
fi
: >"$log"

host_kind() {
  if command -v npu-smi >/dev/null 2>&1 || ls /dev/davinci* >/dev/null 2>&1; then echo ascend
  elif command -v nvidia-smi >/dev/null 2>&1; then echo nvidia
  else echo cpu; fi
}
host=$(host_kind)

# reuse, install, or one line saying what to fix (an installed torch that fails to import is never replaced).
torch_plan=$(PYTHONPATH="$root/DeepSpeed:$root/Megatron-DeepSpeed${PYTHONPATH:+:$PYTHONPATH}" \
             "$venv/bin/python" -m deepspeed_npu.torch_install "$host") || exit 1
if [ "$torch_plan" = reuse ]; then
  say "reusing torch $("$venv/bin/python" -c 'import torch; print(torch.__version__)')"
elif [ "$host" = nvidia ]; then
  say "installing torch 2.13.0 (NVIDIA GPU found)"
  pip_install "torch==2.13.0"
else
  say "installing torch 2.13.0, CPU build (no accelerator found)"
  pip_install "torch==2.13.0+cpu" --extra-index-url https://download.pytorch.org/whl/cpu
fi

say "installing pinned requirements (deepspeed builds from source: a minute or two)"
pip_install setuptools wheel
deps=$(mktemp)
trap 'rm -f "$deps"' EXIT
grep -hvE '^\s*(#|$|torch==)' "${requirements[@]}" >"$deps"
# Pure-Python DeepSpeed ops, except the CPU shared-memory collective op: prebuilt now so that no compiler
# is needed at run time. Build isolation off so DeepSpeed's build sees the torch chosen above.
DS_BUILD_OPS=0 DS_BUILD_SHM_COMM=$([ "$host" = cpu ] && echo 1 || echo 0) \
  pip_install --no-build-isolation -r "$deps"
# The project itself (megatron, deepspeed_npu), editable: its dependencies are the ones just installed.
pip_install --no-build-isolation --no-deps -e "$root"

touch "$stamp"
say "ready"
echo "$venv/bin/python"
