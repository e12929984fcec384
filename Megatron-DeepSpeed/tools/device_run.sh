#!/usr/bin/env bash
# The whole device run in one command: the speed grid of the 345M and 1.3B shapes on one device (bf16, a global
# batch of 512 x 1024 tokens by gradient accumulation, each shape's fastest eager cell also under --torch-compile),
# sized for under 8 minutes on an H100 (docs/benchmarks.md has the estimate), its report written into one new
# directory: report.md (the table), speed.json (the rows), logs.txt (every cell's command and output).
#   bash Megatron-DeepSpeed/tools/device_run.sh DIR [device_check.py flags, e.g. --cpu]
#   bash Megatron-DeepSpeed/tools/device_run.sh --prepare
# --prepare, on a host with the project's .venv and a package index: puts into <repo>/.whl the wheels a device
# host without network lacks (DeepSpeed, which publishes only its source, built here without its C++ ops, and the
# requirements of it missing there), for Python 3.12 on x86-64 Linux; device_check.sh installs them from there.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
if [ "${1:-}" = "--prepare" ]; then
  python=${PYTHON:-$root/.venv/bin/python}
  version() { "$python" -c 'import importlib.metadata, sys; print(importlib.metadata.version(sys.argv[1]))' "$1"; }
  mkdir -p "$root/.whl"
  # DS_ACCELERATOR=cuda: built for the device host's accelerator, a pure-Python wheel any Python 3 installs (built
  # for this CPU host's, it would compile DeepSpeed's shared-memory op and be tagged for this Python alone).
  rm -f "$root"/.whl/deepspeed-*.whl
  DS_ACCELERATOR=cuda DS_BUILD_OPS=0 "$python" -m pip wheel -q --no-deps --no-build-isolation --no-cache-dir \
    -w "$root/.whl" \
    "deepspeed==$(version deepspeed)"
  "$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$root/.whl" \
    "hjson==$(version hjson)" "pydantic==$(version pydantic)" "pydantic-core==$(version pydantic-core)" \
    "annotated-types==$(version annotated-types)" "typing-inspection==$(version typing-inspection)"
  ls "$root/.whl"
  exit 0
fi
report_dir=${1:?usage: device_run.sh DIR [--cpu ...] | device_run.sh --prepare}
shift
# 6 iterations logged every 3: the first window (start-up, compilation) untimed, 3 x 512 samples timed per cell.
exec bash "$here/device_check.sh" --only speed --iterations 6 --log-interval 3 --report-dir "$report_dir" "$@"
