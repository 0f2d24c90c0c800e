"""Tuning records: which schedule won for (device, op, problem), and what it was measured against.

Lookup order: user records (cache dir) -> records of a loaded bundle -> shipped
schedules/<arch>.json -> the op's heuristic. A record from another arch is never applied.
User records must match the device exactly (arch and multiprocessor count); shipped records
match on arch, preferring the same count. The CPU emulator's arch includes its warp size
("cpu-w32", "cpu-w64"): its schedules depend on it as a GPU's depend on its arch.

A record is a plain JSON object. Required: arch, device, op, problem, schedule. Written by the
tuner besides: time_us, heuristic {schedule, time_us}, runners_up [{schedule, time_us}], check
{passed, max_error, rtol, atol}, timing, jitops version, compiler, created, and `space`: the op's
schedule-space generation (the op module's SPACE, raised when it gains a kernel family that
earlier tuning could not have chosen). A record of another generation is skipped: it was tuned
over candidates that no longer describe the op, and the next source (or the heuristic) decides.
Files are
{"format": 1, "jitops": version, "records": [...]}, written atomically; the user file is changed
under a lock so that two tuning processes never lose each other's records.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from . import config
from ._version import __version__
from .device import DeviceInfo
from .ops.base import Schedule

log = logging.getLogger("jitops.records")
FORMAT = 1
REQUIRED = ("arch", "op", "problem", "schedule")
PREFER = ("faster", "incoming", "existing")


def record_arch(device: DeviceInfo) -> str:
    """The arch records are kept under; for the emulator it includes the warp size."""
    return f"cpu-w{device.warp_size}" if device.backend == "cpu" else device.arch


def device_key(device: DeviceInfo) -> str:
    """Record identity of a device: arch plus multiprocessor count (as MIOpen keys its perf-db)."""
    return f"{record_arch(device)}-{device.multiprocessors}sm"


def user_records_path() -> Path:
    return config.cache_dir() / "records" / "user.json"


def shipped_records_path(arch: str) -> Path:
    return config.schedules_dir() / f"{arch}.json"


def record_space(r: dict[str, Any]) -> int:
    """The schedule-space generation a record was tuned over (0: before generations were stamped)."""
    try:
        return int(r.get("space", 0))
    except (TypeError, ValueError):
        return -1


def op_space(op: Any) -> int:
    """An op module's schedule-space generation (SPACE, 0 when it never changed)."""
    return int(getattr(op, "SPACE", 0))


def is_valid(r: Any) -> bool:
    """Has what a lookup needs, with a schedule that can be rebuilt."""
    if not isinstance(r, dict) or not all(isinstance(r.get(k), (str, dict)) for k in REQUIRED):
        return False
    s = r["schedule"]
    return isinstance(s, dict) and isinstance(s.get("algorithm"), str) and isinstance(s.get("params", {}), dict)


def plan_failure(op: Any, problem: Any, schedule: Schedule, device: DeviceInfo) -> str | None:
    """Why a recorded schedule no longer plans for this problem (a record from another jitops
    version may name parameters the op no longer takes), or None when it does. The one check both
    the engine (select_schedule) and the tuner (from_record) apply before trusting a record."""
    try:
        op.plan(problem, schedule, device)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def read_records(path: Path) -> list[dict[str, Any]]:
    """The valid records of a file; [] (with a warning) for a missing-format or unreadable file."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        log.warning("ignoring unreadable tuning records %s (%s)", path, exc)
        return []
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("records"), list):
        log.warning("ignoring tuning records %s: not jitops record format %d", path, FORMAT)
        return []
    good = [r for r in data["records"] if is_valid(r)]
    if len(good) != len(data["records"]):
        log.warning("%s: skipped %d malformed records", path, len(data["records"]) - len(good))
    return good


def record_id(r: dict[str, Any]) -> tuple[str, str, str, str]:
    """What makes two records compete: same device (arch + multiprocessors), op and problem."""
    return (r["arch"], r.get("device", r["arch"]), r["op"], r["problem"])


def write_records(path: Path, records: Iterable[dict[str, Any]]) -> None:
    """Atomic write (temporary file + rename), records in a stable order for readable diffs."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    ordered = sorted(records, key=record_id)
    body = json.dumps({"format": FORMAT, "jitops": __version__, "records": ordered}, indent=1, sort_keys=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".records-")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(body + "\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def new_record(device: DeviceInfo, op: str, problem: str, schedule: Schedule, **fields: Any) -> dict[str, Any]:
    """A record for this device, stamped with the jitops version and the date."""
    return {"arch": record_arch(device), "device": device_key(device), "device_name": device.name,
            "backend": device.backend, "op": op, "problem": problem, "schedule": schedule.as_dict(),
            "jitops": __version__, "created": time.strftime("%Y-%m-%dT%H:%M:%S"), **fields}


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock beside `path` across processes (no-op where fcntl is missing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not on POSIX
        yield
        return
    with open(path.with_suffix(path.suffix + ".lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@dataclass
class MergeReport:
    added: int = 0
    replaced: int = 0
    kept: int = 0
    invalid: int = 0

    def __str__(self) -> str:
        return f"{self.added} added, {self.replaced} replaced, {self.kept} kept, {self.invalid} invalid"


def _time(r: dict[str, Any]) -> float:
    t = r.get("time_us")
    return float(t) if isinstance(t, (int, float)) else float("inf")


def merge_into(existing: list[dict[str, Any]], incoming: Iterable[Any], prefer: str = "faster"
               ) -> tuple[list[dict[str, Any]], MergeReport]:
    """Combine record lists; on a conflict keep the faster measured time (or the incoming/existing one)."""
    if prefer not in PREFER:
        raise ValueError(f"prefer must be one of {', '.join(PREFER)}, got {prefer!r}")
    table = {record_id(r): r for r in existing}
    report = MergeReport()
    for r in incoming:
        if not is_valid(r):
            report.invalid += 1
            continue
        rid = record_id(r)
        old = table.get(rid)
        if old is None:
            table[rid] = r
            report.added += 1
        elif prefer == "incoming" or (prefer == "faster" and _time(r) < _time(old)):
            table[rid] = r
            report.replaced += 1
        else:
            report.kept += 1
    return list(table.values()), report


class RecordStore:
    """In-memory index over the user and shipped record files, reloaded when a file changes."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._index: dict[str, tuple[tuple, dict]] = {}
        self.extra: list[dict[str, Any]] = []   # records embedded in a loaded bundle

    # ---- reading
    def _load(self, path: Path) -> dict:
        try:
            st = path.stat()
            stamp: tuple = (st.st_mtime_ns, st.st_size)
        except OSError:
            stamp = ()
        cached = self._index.get(str(path))
        if cached and cached[0] == stamp:
            return cached[1]
        table = {record_id(r): r for r in (read_records(path) if stamp else [])}
        self._index[str(path)] = (stamp, table)
        return table

    def find(self, device: DeviceInfo, op: str, problem_key: str,
             space: int = 0) -> tuple[dict[str, Any], str] | None:
        """The record of schedule-space generation `space` that applies on this device and where it
        came from ('user', 'bundle', 'shipped')."""
        arch, dkey = record_arch(device), device_key(device)

        def current(r: dict[str, Any] | None, origin: str) -> bool:
            if r is None:
                return False
            if record_space(r) != space:
                log.info("skipping %s record for %s: tuned over %s's schedule space %d, now %d",
                         origin, problem_key, op, record_space(r), space)
                return False
            return True

        with self._lock:
            hit = self._load(user_records_path()).get((arch, dkey, op, problem_key))
            if current(hit, "user"):
                return hit, "user"
            for r in self.extra:
                if is_valid(r) and (r["arch"], r["op"], r["problem"]) == (arch, op, problem_key) and current(r, "bundle"):
                    return r, "bundle"
            shipped = self._load(shipped_records_path(arch))
            same_arch = [r for (a, _, o, p), r in shipped.items() if (a, o, p) == (arch, op, problem_key)]
            for r in sorted(same_arch, key=lambda r: r["device"] != dkey):     # this device's count first
                if current(r, "shipped"):
                    return r, "shipped"
        return None

    def lookup(self, device: DeviceInfo, op: str, problem_key: str,
               space: int = 0) -> tuple[Schedule, str] | None:
        """The recorded schedule and where it came from, or None (then the heuristic decides)."""
        found = self.find(device, op, problem_key, space)
        if found is None:
            return None
        return Schedule.from_dict(found[0]["schedule"]), found[1]

    def user_records(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._load(user_records_path()).values())

    def shipped_records(self, arch: str | None = None) -> list[dict[str, Any]]:
        """Shipped records of one arch, or of every schedules/*.json file."""
        paths = [shipped_records_path(arch)] if arch else sorted(config.schedules_dir().glob("*.json"))
        out: list[dict[str, Any]] = []
        with self._lock:
            for path in paths:
                # A shipped file holds its own arch only: anything else in it is never applied.
                out += [r for r in self._load(path).values() if r["arch"] == path.stem]
        return out

    # ---- writing (the user file, under a lock across processes)
    def _update_user(self, change: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]) -> None:
        path = user_records_path()
        with self._lock, _file_lock(path):
            records = read_records(path)
            write_records(path, change(records))
            self._index.pop(str(path), None)

    def put(self, records: Iterable[dict[str, Any]]) -> None:
        """Add or replace user records (a new measurement replaces the old one for the same device)."""
        new = [r for r in records if is_valid(r)]
        if new:
            self._update_user(lambda old: merge_into(old, new, prefer="incoming")[0])

    def merge(self, paths: Iterable[Path], prefer: str = "faster") -> MergeReport:
        """Merge record files (another machine's export, a colleague's) into the user records."""
        incoming: list[Any] = []
        for p in paths:
            try:
                data = json.loads(Path(p).read_text())
            except (OSError, ValueError) as exc:
                raise ValueError(f"cannot read tuning records {p}: {exc}") from exc
            if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("records"), list):
                raise ValueError(f"{p} is not a jitops tuning-record file (format {FORMAT})")
            incoming += data["records"]
        report = MergeReport()

        def change(old: list[dict[str, Any]]) -> list[dict[str, Any]]:
            nonlocal report
            merged, report = merge_into(old, incoming, prefer)
            return merged

        self._update_user(change)
        return report

    def remove(self, match: Callable[[dict[str, Any]], bool] | None = None) -> int:
        """Remove user records for which `match` is true (all of them when it is None)."""
        removed = 0

        def change(old: list[dict[str, Any]]) -> list[dict[str, Any]]:
            nonlocal removed
            kept = [r for r in old if match is not None and not match(r)]
            removed = len(old) - len(kept)
            return kept

        self._update_user(change)
        return removed

    def invalidate(self) -> None:
        with self._lock:
            self._index.clear()


def export_records(path: Path, records: Iterable[dict[str, Any]]) -> int:
    rs = list(records)
    write_records(path, rs)
    return len(rs)


_store = RecordStore()


def store() -> RecordStore:
    return _store
