"""A compile worker process: `python -m jitops.tuning.worker SPEC`, one JSON job a line on stdin.

The tuner renders every candidate's source in the parent and sends it here; a worker only
compiles (through the binary cache, so the parent later loads the result from disk) and reports
how long it took and what the compiler said about resources. Running compiles in separate
processes lets the parent use every core and kill a compile that hangs, without losing the run.
Protocol: job {"id", "source", "kernels", "label"} -> reply {"id", "ok", "seconds", "origin",
"key", "error", "resources": {kernel: {"registers", "spill_bytes", "smem"}}}.
"""
from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from typing import Any

_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_REGS = re.compile(r"Used (\d+) registers")
_SPILL = re.compile(r"(\d+) bytes spill stores")
_SMEM = re.compile(r"(\d+) bytes smem")


def parse_ptxas(text: str) -> dict[str, dict[str, int]]:
    """Registers, spill stores and static shared memory per kernel from `ptxas -v` output."""
    out: dict[str, dict[str, int]] = {}
    current = None
    for line in text.splitlines():
        m = _ENTRY.search(line)
        if m:
            current = out.setdefault(m.group(1), {})
            continue
        if current is None:
            continue
        for name, pattern in (("registers", _REGS), ("spill_bytes", _SPILL), ("smem", _SMEM)):
            m = pattern.search(line)
            if m:
                current[name] = int(m.group(1))
    return out


class _Capture(logging.Handler):
    """Keeps the messages a backend logs while compiling (NVRTC's log carries ptxas -v)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def make_backend(spec: dict[str, Any]) -> Any:
    from jitops.runtime import get_backend
    if spec["name"] == "cpu":
        return get_backend("cpu", warp_size=int(spec["warp_size"]), checked=bool(spec["checked"]))
    return get_backend(spec["name"], target=spec["arch"])


def short_error(exc: BaseException, limit: int = 1200) -> str:
    text = f"{type(exc).__name__}: {exc}"
    errors = [ln for ln in text.splitlines() if "error" in ln.lower()]
    text = "\n".join(errors[:8]) if errors else text
    return text[:limit]


def serve(spec: dict[str, Any], reply: Any) -> None:
    from pathlib import Path

    from jitops.cache import DiskCache, KernelLoader
    backend = make_backend(spec)
    # The parent's binary cache, wherever this process's environment would put its own.
    loader = KernelLoader(DiskCache(Path(spec["disk"])) if spec.get("disk") else None)
    capture = _Capture()
    for name in ("jitops.cuda", "jitops.hip"):
        logger = logging.getLogger(name)
        logger.setLevel(logging.DEBUG)
        logger.addHandler(capture)
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        capture.lines.clear()
        t0 = time.perf_counter()
        answer: dict[str, Any] = {"id": job["id"]}
        try:
            built = loader.binary(backend, job["source"], job["kernels"], job["label"])
            answer.update(ok=True, origin=built.origin, key=built.key)
        except Exception as exc:  # a candidate that does not compile: report it, keep serving
            answer.update(ok=False, error=short_error(exc))
        answer["seconds"] = time.perf_counter() - t0
        answer["resources"] = parse_ptxas("\n".join(capture.lines))
        reply.write(json.dumps(answer) + "\n")
        reply.flush()


def main() -> None:
    spec = json.loads(sys.argv[1])
    # The protocol owns the real stdout; anything else printed goes to stderr.
    reply = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)          # also for compilers and libraries that write to fd 1
    sys.stdout = sys.stderr
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    serve(spec, reply)


if __name__ == "__main__":
    main()
