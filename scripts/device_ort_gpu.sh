#!/usr/bin/env bash
# On the lent GPU machine: the CUDA execution provider path for real. The onnxruntime-gpu wheel
# (about 256 MB) is over one device call's carry, so earlier calls in quick succession leave its
# pieces (split -b 44m -d -a 1 WHEEL .ortgpu/p: a piece and the working tree
# must stay under one call's 64 MiB) under /root/ort; this joins and installs them,
# then runs the ONNX GPU tests (CUDA EP included) with the report under $OUT, or the command given
# after the checksum (e.g. python3 scripts/device_ort_cuda.py --out $OUT: real models end to end).
# Usage: scripts/device_ort_gpu.sh SHA256_OF_WHEEL [COMMAND ...]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/jitops-out}
WHEEL=/tmp/onnxruntime_gpu-1.31.1-cp312-cp312-manylinux_2_28_x86_64.whl
mkdir -p /root/ort; cp .ortgpu/p* /root/ort/ 2>/dev/null
cat $(ls /root/ort/p* | sort) > "$WHEEL" || exit 1          # every piece, in order
echo "$1  $WHEEL" | sha256sum -c - || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/ortsite "$WHEEL" || exit 1
export PYTHONPATH=/tmp/ortsite:/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -c "import onnxruntime as o; print('onnxruntime', o.__version__, o.get_available_providers())"
if [ $# -gt 1 ]; then shift; "$@"; exit $?; fi
JITOPS_REPORT_DIR=$OUT python3 -m pytest -m gpu -q -s -p no:cacheprovider tests/test_gpu_onnx.py 2>&1 | tee "$OUT/gpu_onnx.log"
