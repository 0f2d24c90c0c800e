"""Compile candidate sources in parallel worker processes, each compile under a time limit.

Workers are plain subprocesses (`python -m jitops.tuning.worker`), not multiprocessing: they never
re-import the caller's script, and a compile that hangs is ended by killing that one process
(the pool starts a fresh worker in its place). A job that fails, times out or is cut by the
deadline comes back with ok=False and a reason; the tuner then counts that candidate as
infinitely slow.
"""
from __future__ import annotations

import json
import logging
import os
import selectors
import subprocess
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

log = logging.getLogger("jitops.tune")

_PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])


@dataclass(frozen=True)
class CompileJob:
    key: str                    # binary-cache key (the parent's; the worker reports its own)
    source: str
    kernels: tuple[str, ...]
    label: str


@dataclass
class CompileOutcome:
    key: str
    status: str                 # "ok" | "failed" | "timeout" | "skipped"
    seconds: float = 0.0
    origin: str = ""            # "compiled" | "disk" | "bundle"
    error: str = ""
    resources: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def backend_spec(backend: Any) -> dict[str, Any]:
    """What a worker needs to build an equivalent (compile-only) backend."""
    from ..cache import loader
    d = backend.device
    spec: dict[str, Any] = {"name": backend.name, "arch": d.arch, "disk": str(loader().disk.directory)}
    if backend.name == "cpu":
        spec.update(warp_size=d.warp_size, checked=bool(getattr(backend, "checked", False)))
    return spec


def default_workers() -> int:
    return max(1, min(os.cpu_count() or 1, 16))


class _Worker:
    def __init__(self, command: Sequence[str]):
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_PARENT, env.get("PYTHONPATH", "")) if p)
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(list(command), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.stderr, env=env, text=True, bufsize=1)
        self.job: CompileJob | None = None
        self.started = 0.0

    def send(self, job: CompileJob) -> None:
        self.job, self.started = job, time.monotonic()
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"id": job.key, "source": job.source, "kernels": list(job.kernels),
                                          "label": job.label}) + "\n")
        self.proc.stdin.flush()

    def stderr_tail(self, limit: int = 800) -> str:
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")[-limit:]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.stderr.close()

    def close(self) -> None:
        try:
            if self.proc.stdin:
                self.proc.stdin.close()
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.kill()


class CompilePool:
    """Worker processes that compile CompileJobs; use as a context manager."""

    def __init__(self, backend: Any, workers: int | None = None, timeout_s: float = 60.0,
                 command: Sequence[str] | None = None):
        self.command = list(command) if command else [sys.executable, "-m", "jitops.tuning.worker",
                                                      json.dumps(backend_spec(backend))]
        self.size = max(1, workers or default_workers())
        self.timeout_s = float(timeout_s)
        self._workers: list[_Worker] = []
        self.expected_keys = True

    def __enter__(self) -> "CompilePool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        for w in self._workers:
            w.close()
        self._workers.clear()

    def run(self, jobs: Iterable[CompileJob], deadline: float | None = None,
            on_done: Callable[[CompileOutcome], None] | None = None) -> dict[str, CompileOutcome]:
        """Compile every job (in order of priority); returns outcomes by job key."""
        queue = deque(jobs)
        results: dict[str, CompileOutcome] = {}
        want = min(self.size, len(queue))
        while len(self._workers) < want:
            self._workers.append(_Worker(self.command))
        sel = selectors.DefaultSelector()

        def finish(outcome: CompileOutcome) -> None:
            results[outcome.key] = outcome
            if on_done is not None:
                on_done(outcome)

        def restart(i: int, respawn: bool = True) -> None:
            old = self._workers[i]
            try:
                sel.unregister(old.proc.stdout)
            except (KeyError, ValueError):
                pass
            old.kill()
            if respawn:
                self._workers[i] = _Worker(self.command)
                sel.register(self._workers[i].proc.stdout, selectors.EVENT_READ, i)

        for i, w in enumerate(self._workers):
            sel.register(w.proc.stdout, selectors.EVENT_READ, i)
        try:
            while queue or any(w.job for w in self._workers):
                now = time.monotonic()
                if deadline is not None and now > deadline:
                    for i, w in enumerate(self._workers):
                        if w.job is not None:
                            finish(CompileOutcome(w.job.key, "skipped", now - w.started,
                                                  error="compile cut short: tuning budget spent"))
                            w.job = None
                            restart(i, respawn=False)
                    while queue:
                        finish(CompileOutcome(queue.popleft().key, "skipped",
                                              error="not compiled: tuning budget spent"))
                    break
                for w in self._workers:
                    if w.job is None and queue:
                        w.send(queue.popleft())
                for ev, _ in sel.select(timeout=0.2):
                    i = ev.data
                    w = self._workers[i]
                    line = w.proc.stdout.readline() if w.proc.stdout else ""
                    job = w.job
                    if job is None:
                        continue
                    w.job = None
                    if not line:
                        finish(CompileOutcome(job.key, "failed", time.monotonic() - w.started,
                                              error=f"compile worker died: {w.stderr_tail()}"))
                        restart(i)
                        continue
                    finish(self._outcome(job, json.loads(line)))
                now = time.monotonic()
                for i, w in enumerate(self._workers):
                    if w.job is not None and now - w.started > self.timeout_s:
                        log.info("compile of %s timed out after %.0f s; worker killed", w.job.label, self.timeout_s)
                        finish(CompileOutcome(w.job.key, "timeout", now - w.started,
                                              error=f"compile timed out after {self.timeout_s:.0f} s"))
                        w.job = None
                        restart(i)
        finally:
            sel.close()
        return results

    def _outcome(self, job: CompileJob, reply: dict[str, Any]) -> CompileOutcome:
        if reply.get("ok") and reply.get("key") != job.key and self.expected_keys:
            # The parent would not find the worker's binary under its own key: it compiles again on load.
            log.warning("compile worker keys differ from this process's (backend options?); loads will recompile")
            self.expected_keys = False
        return CompileOutcome(job.key, "ok" if reply.get("ok") else "failed", float(reply.get("seconds", 0.0)),
                              reply.get("origin", ""), reply.get("error", ""), reply.get("resources", {}))


# ---------------------------------------------------------------- the tuner's compile phase

def _in_cache(key: str) -> bool:
    from ..cache import loader
    ld = loader()
    return ld.disk_enabled and ld.disk.get(key) is not None


def compile_missing(jobs: list[CompileJob], backend: Any, workers: int | None, timeout_s: float,
                    deadline: float | None, progress: bool | None = None) -> dict[str, CompileOutcome]:
    """Compile the jobs whose binaries are not in the disk cache yet, in worker processes."""
    from ..cache import loader
    from .progress import bar
    todo = [j for j in jobs if not _in_cache(j.key)]
    if not todo:
        return {}
    if not loader().disk_enabled:
        log.warning("disk cache disabled (JITOPS_NO_DISK_CACHE): compiling %d kernels in this process, "
                    "serially and without a time limit", len(todo))
        return {}
    log.info("compiling %d kernels (%d already cached) in %d workers", len(todo), len(jobs) - len(todo),
             min(len(todo), workers or default_workers()))
    with bar(total=len(todo), desc="compile", unit="kernel", enable=progress) as pb, \
            CompilePool(backend, workers, timeout_s) as pool:
        def done(o: CompileOutcome) -> None:
            pb.update(1)
            if not o.ok:
                log.info("compile %s: %s", o.status, o.error.splitlines()[0] if o.error else "")
        return pool.run(todo, deadline=deadline, on_done=done)
