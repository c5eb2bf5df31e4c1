#!/usr/bin/env bash
# Kernel correctness on CUDA and the kernel benchmarks, from the source tree, with the machine's own
# torch/triton/pytest/hypothesis (for a GPU machine without network access). Logs go to ${OUT:-.}.
# Usage: bash tools/gpu_check.sh [test seconds (default 300)] [seconds per benchmark (default 120)]
set -uo pipefail
out=${OUT:-.}
test_seconds=${1:-300}
bench_seconds=${2:-120}
export PYTHONPATH=shared-kernels/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
timeout "$test_seconds" python3 -m pytest shared-kernels/tests -q -p no:cacheprovider -m "not slow" \
    -o addopts="" --durations=5 --deselect shared-kernels/tests/test_kernels_public_api.py::test_version_matches_distribution_metadata 2>&1 | tee "$out/gpu_tests.log"
status=${PIPESTATUS[0]}
for script in shared-kernels/benchmarks/bench_*.py; do
    echo "== $script"
    timeout "$bench_seconds" python3 "$script" --quick 2>&1 | tee -a "$out/gpu_bench.log"
done
exit "$status"
