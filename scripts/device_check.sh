#!/usr/bin/env bash
# On the lent GPU machine (see ../.library/device): carried wheels, GPU tests, then the benchmark.
# Usage: scripts/device_check.sh [pytest -k expr] [bench ops]   (results under $OUT)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/jitops-out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
nvidia-smi -L 2>/dev/null
python3 -c "import sys, torch, numpy; print('python', sys.version.split()[0], 'torch', torch.__version__, 'numpy', numpy.__version__)"
python3 -m jitops info
KEXPR=${1:-}
OPS=${2:-leaky_relu}
python3 -m pytest -m gpu -q -p no:cacheprovider ${KEXPR:+-k "$KEXPR"} tests 2>&1 | tee "$OUT/gpu_tests.log"
python3 -m jitops bench --ops "$OPS" --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log"
