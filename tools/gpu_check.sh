#!/usr/bin/env bash
# Kernel correctness on CUDA and the kernel benchmarks, from the source tree, with the machine's own
# torch/triton/pytest/hypothesis (for a GPU machine without network access). Writes logs to ${OUT:-.}.
# Usage: bash tools/gpu_check.sh [pytest args...]
set -uo pipefail
out=${OUT:-.}
export PYTHONPATH=shared-kernels/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
python3 -m pytest shared-kernels/tests -q -p no:cacheprovider -x -m "not slow" "$@" 2>&1 | tee "$out/gpu_tests.log"
status=${PIPESTATUS[0]}
for script in shared-kernels/benchmarks/bench_*.py; do
    echo "== $script"
    timeout 120 python3 "$script" 2>&1 | tee -a "$out/gpu_bench.log"
done
exit "$status"
