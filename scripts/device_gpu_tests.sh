#!/usr/bin/env bash
# The whole GPU test suite (`pytest -m gpu`) in eight pytest processes side by side: most of its time
# is NVRTC compiles on the host, which one process does one at a time (H100 machine with 16 cores,
# 2026-11-27: 5 minutes; the groups' own times add up to 18; at 10:30 the wgmma attention tests alone
# took over 8 minutes in one process, hence two). One compile cache for all of them.
#   bash scripts/device_gpu_tests.sh [OUT_DIR]      (each group's log and exit status land there)
set -u
out=${1:-${OUT:-gpu_tests}}
mkdir -p "$out"
export JITOPS_CACHE_DIR=${JITOPS_CACHE_DIR:-/tmp/jitops_gpu_tests_cache}
: > "$out/rc.txt"
run() {
  local name=$1; shift
  timeout "${GPU_TESTS_TIMEOUT:-900}" python3 -m pytest -q -rs -m gpu -p no:cacheprovider --durations=6 "$@" \
    > "$out/pytest_$name.txt" 2>&1
  echo "$name rc=$?" >> "$out/rc.txt"
}
split="wgmma_tma or wgmma_trimmed or query_walk or lazy_rescale"      # attention's wgmma tests in two halves
run attn1 tests/test_gpu_attention.py -k "wgmma and ($split)" &
run attn4 tests/test_gpu_attention.py -k "wgmma and not ($split)" &
run attn2 tests/test_gpu_attention.py -k "not wgmma and not decode" &
run attn3 tests/test_gpu_attention.py -k "decode" &
run conv1 tests/test_gpu_conv2d.py -k "wgmma" &
run conv2 tests/test_gpu_conv2d.py -k "not wgmma" &
run misc tests/test_wgmma.py tests/test_gpu_alignment.py tests/test_gpu_norms.py tests/test_gpu_leaky_relu.py \
  tests/test_gpu_attention_tf32.py \
  tests/test_gpu_streams.py &
run rest tests/test_gpu_native.py tests/test_gpu_tune.py tests/test_gpu_onnx.py tests/test_gpu_benchmark_mode.py \
  tests/test_ort_gpu_node_path.py tests/test_gpu_fuzz.py &
wait
status=0
for f in "$out"/pytest_*.txt; do
  echo "$(basename "$f" .txt): $(grep -E '(passed|failed|error)' "$f" | tail -1)"
done
grep -v "rc=0" "$out/rc.txt" && status=1
exit $status
