"""hiprtc compilation, in this process or as a worker process (see hip_backend.py for why).

As a script it reads a JSON job on stdin: {"source": path, "output": path, "label": str,
"options": [...]}, writes the code object to `output` and the compiler log to stderr, and exits
with status 0 on success. It imports nothing from jitops, so the worker starts fast.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def hiprtc_compile(source: str, label: str, options: list[str], destroy: bool = True) -> tuple[bool, bytes, str]:
    """Compile with hiprtc; returns (ok, code object, log).

    destroy=False leaves the program to process exit: hiprtcDestroyProgram of ROCm 5.x crashes
    under hip-python 6.x, which only matters to the worker (on ROCm 5 systems without a GPU).
    """
    from hip import hiprtc
    err, prog = hiprtc.hiprtcCreateProgram(source.encode(), f"{label}.hip".encode(), 0, [], [])
    if int(err) != 0:
        return False, b"", f"hiprtcCreateProgram failed: {err}"
    try:
        opts = [o.encode() for o in options]
        (res,) = hiprtc.hiprtcCompileProgram(prog, len(opts), opts)
        _, size = hiprtc.hiprtcGetProgramLogSize(prog)
        buf = bytearray(max(int(size), 1))
        hiprtc.hiprtcGetProgramLog(prog, buf)
        compile_log = bytes(buf).rstrip(b"\0").decode(errors="replace")
        if int(res) != 0:
            return False, b"", compile_log or f"hiprtcCompileProgram failed: {res}"
        _, size = hiprtc.hiprtcGetCodeSize(prog)
        code = bytearray(int(size))
        (err,) = hiprtc.hiprtcGetCode(prog, code)
        if int(err) != 0:
            return False, b"", f"hiprtcGetCode failed: {err}"
        return True, bytes(code), compile_log
    finally:
        if destroy:
            hiprtc.hiprtcDestroyProgram(prog)


def main() -> int:
    job = json.loads(sys.stdin.read())
    ok, code, log = hiprtc_compile(Path(job["source"]).read_text(), job["label"], job["options"], destroy=False)
    if log:
        sys.stderr.write(log)
    if not ok:
        return 1
    Path(job["output"]).write_bytes(code)
    return 0


if __name__ == "__main__":
    sys.path.pop(0)  # this file's folder: keep jitops' own modules from shadowing `hip`
    sys.exit(main())
