#!/usr/bin/env bash
# Set up the environment (idempotent) and run every test suite of the project; the ten slowest tests are listed at
# the end. With no arguments (the README's and CI's command) on a CPU with AVX512, the bf16/fp16 tests run once more
# with the kernels of a CPU without it, whose bf16 sums round differently (docs/install.md#tests).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
python=$(bash "$root/Megatron-DeepSpeed/tools/setup_env.sh" --tests)
cd "$root"
suites=(-c Megatron-DeepSpeed/pytest.ini Megatron-DeepSpeed/tests DeepSpeed/tests)
"$python" -m pytest "${suites[@]}" --durations=10 "$@"
if [ $# -eq 0 ] && [ "$("$python" -c 'import torch; print(torch.backends.cpu.get_cpu_capability())')" = AVX512 ]; then
    echo "run_tests: the low_precision tests again as on a CPU without AVX512 (--cpu-isa avx2)"
    "$python" -m pytest "${suites[@]}" -m low_precision --cpu-isa avx2
fi
