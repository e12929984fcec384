#!/usr/bin/env bash
# Ascend NPU environment for the training scripts. Source it, do not run it:
#
#     source test/env_npu.sh
#
# - CANN: sources the toolkit's set_env.sh when CANN is installed and not yet loaded (searched under
#   ASCEND_ROOT, default /usr/local/Ascend: ascend-toolkit, cann, nnae; then ~/Ascend; then the newest
#   versioned cann-<version>/) and puts the driver's libraries on LD_LIBRARY_PATH; torch_npu cannot load
#   without both, and then even `import torch` fails
# - HCCL: no timeouts here. HCCL_EXEC_TIMEOUT / HCCL_CONNECT_TIMEOUT follow --distributed-timeout-minutes
#   (megatron/parallel_state.py, hccl_timeouts), so torch's and HCCL's limits agree; export them yourself
#   only below that flag's time
# - task queue: torch_npu's two-stage operator dispatch, level 2
# - PYTHONPATH: the deepspeed_npu adaptor (DeepSpeed/) and the trainer (Megatron-DeepSpeed/)
# A variable that is already set keeps its value. Safe on machines without NPUs: there it only sets
# variables that nothing but Ascend software reads. Check the result with `python -m deepspeed_npu`.

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  echo "env_npu.sh sets variables for the shell that sources it: run 'source $0' instead" >&2
  exit 2
fi

_env_npu_setup() {
  local root ascend_root set_env candidate directory caller_flags=$- caller_pipefail="" status versioned
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  ascend_root=${ASCEND_ROOT:-/usr/local/Ascend}

  # CANN's set_env.sh sets ASCEND_TOOLKIT_HOME (older releases) or ASCEND_HOME_PATH (newer): loaded if either is.
  if [ -z "${ASCEND_TOOLKIT_HOME:-}" ] && [ -z "${ASCEND_HOME_PATH:-}" ]; then
    set_env=""
    mapfile -t versioned < <(compgen -G "$ascend_root/cann-*/set_env.sh" | sort -rV)
    for candidate in "$ascend_root/ascend-toolkit/set_env.sh" "$ascend_root/cann/set_env.sh" \
                     "$ascend_root/nnae/set_env.sh" "$HOME/Ascend/ascend-toolkit/set_env.sh" \
                     "$HOME/Ascend/nnae/set_env.sh" \
                     "${versioned[@]}"; do
      if [ -f "$candidate" ]; then set_env=$candidate; break; fi
    done
    if [ -n "$set_env" ]; then
      # CANN's script reads variables that may be unset and runs commands that may fail; the calling script may
      # run with `set -euo pipefail`, which would end it there without a word. So CANN's script runs with the
      # caller's options off, they are restored after, and a failure is one line.
      if shopt -qo pipefail; then caller_pipefail=1; fi
      set +euo pipefail
      # shellcheck disable=SC1090
      source "$set_env"
      status=$?
      if [ -n "$caller_pipefail" ]; then set -o pipefail; fi
      case $caller_flags in *u*) set -u ;; esac
      case $caller_flags in *e*) set -e ;; esac
      if [ "$status" -ne 0 ]; then
        echo "env_npu.sh: CANN's $set_env failed (exit status $status); run 'source $set_env' by hand to see" \
             "why, or set ASCEND_ROOT to a working CANN installation" >&2
        return 1
      fi
    elif compgen -G "/dev/davinci[0-9]*" >/dev/null; then
      echo "env_npu.sh: this machine has NPUs but no CANN toolkit under $ascend_root or ~/Ascend;" \
           "install CANN or set ASCEND_ROOT to where it is installed" >&2
    fi
  fi

  for directory in "$ascend_root/driver/lib64" "$ascend_root/driver/lib64/common" \
                   "$ascend_root/driver/lib64/driver"; do
    if [ -d "$directory" ] && [[ ":${LD_LIBRARY_PATH:-}:" != *":$directory:"* ]]; then
      export LD_LIBRARY_PATH="$directory${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    fi
  done

  for directory in "$root/Megatron-DeepSpeed" "$root/DeepSpeed"; do
    if [[ ":${PYTHONPATH:-}:" != *":$directory:"* ]]; then
      export PYTHONPATH="$directory${PYTHONPATH:+:$PYTHONPATH}"
    fi
  done
}
_env_npu_setup  # a caller under `set -e` stops here when CANN's script failed; its line is already printed
_env_npu_status=$?
unset -f _env_npu_setup
if [ "$_env_npu_status" -ne 0 ]; then unset _env_npu_status; return 1; fi
unset _env_npu_status

# No trust-list file for HCCL's inter-node connections: the launcher already names the nodes.
export HCCL_WHITELIST_DISABLE=${HCCL_WHITELIST_DISABLE:-1}
# Operator dispatch split over two host threads; level 2 also moves workspace set-up to the second one.
export TASK_QUEUE_ENABLE=${TASK_QUEUE_ENABLE:-2}
# CANN logs errors only, into its log files rather than the training output.
export ASCEND_GLOBAL_LOG_LEVEL=${ASCEND_GLOBAL_LOG_LEVEL:-3}
export ASCEND_SLOG_PRINT_TO_STDOUT=${ASCEND_SLOG_PRINT_TO_STDOUT:-0}
