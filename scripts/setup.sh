#!/usr/bin/env bash
# Set up a fresh machine for jitops: system packages for the hiprtc (gfx90a) compile checks and
# the CPU emulator, then jitops itself with its test and CUDA (NVRTC) extras.
# Safe to run again; skips what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

# g++: the CPU emulator. ROCm 5.2 (hiprtc): gfx90a compile checks. clang/lld/llvm 19: gfx942 and RDNA3,
# which that hiprtc cannot build.
APT_PACKAGES="g++ hipcc libamdhip64-dev libhiprtc-builtins5 rocm-device-libs clang-19 lld-19 llvm-19"
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  missing=""
  for p in $APT_PACKAGES; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
  if [ -n "$missing" ]; then
    echo "setup: apt-get install$missing"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
  fi
else
  echo "setup: not root or no apt-get; skipping system packages ($APT_PACKAGES)" >&2
fi

PIP="python3 -m pip install -q --disable-pip-version-check"
# A CPU build of torch, when this machine keeps one on disk (tests of torch interop use it).
if ! python3 -c "import torch" 2>/dev/null; then
  wheel=$(ls /opt/wheels/torch-*cpu*.whl 2>/dev/null | head -n 1 || true)
  if [ -n "$wheel" ]; then $PIP "$wheel"; fi
fi
$PIP -e ".[test,cuda,onnx]"
# torch.export's ONNX exporter (torch's default since 2.9) needs onnxscript: the exported-model tests
# also run the corpus through it, and Hugging Face transformers models (tiny configs) through it,
# where they install (those tests skip without them).
if python3 -c "import torch" 2>/dev/null; then
  for pkg in onnxscript transformers; do
    python3 -c "import $pkg" 2>/dev/null || $PIP "$pkg" || echo "setup: $pkg not installable here; its tests skip" >&2
  done
fi
# hip-python matching Debian's ROCm 5.2 libraries (hiprtc lives in libamdhip64 there).
if [ -e /usr/lib/x86_64-linux-gnu/libamdhip64.so.5 ]; then
  python3 -c "import hip" 2>/dev/null || $PIP "hip-python==6.2.0.499.16"
fi
echo "setup: done"
