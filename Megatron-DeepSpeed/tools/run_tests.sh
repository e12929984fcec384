#!/usr/bin/env bash
# Set up the environment (idempotent) and run every test suite of the project.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
python=$(bash "$root/Megatron-DeepSpeed/tools/setup_env.sh" --tests)
cd "$root"
exec "$python" -m pytest -c Megatron-DeepSpeed/pytest.ini Megatron-DeepSpeed/tests DeepSpeed/tests "$@"
