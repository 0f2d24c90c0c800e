"""Tuning records: which schedule won for (device, op, problem).

Lookup order: user records (cache dir) -> shipped schedules/<arch>.json -> the op's heuristic.
A record from another arch is never applied. User records must match the device exactly
(arch and multiprocessor count); shipped records match on arch, preferring the same count.
"""
from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
from pathlib import Path
from typing import Any, Iterable

from . import config
from ._version import __version__
from .device import DeviceInfo
from .ops.base import Schedule

log = logging.getLogger("jitops.records")
FORMAT = 1


def user_records_path() -> Path:
    return config.cache_dir() / "records" / "user.json"


def shipped_records_path(arch: str) -> Path:
    return config.schedules_dir() / f"{arch}.json"


def read_records(path: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        log.warning("ignoring unreadable tuning records %s (%s)", path, exc)
        return []
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("records"), list):
        log.warning("ignoring tuning records %s: not jitops record format %d", path, FORMAT)
        return []
    return [r for r in data["records"] if isinstance(r, dict) and {"arch", "op", "problem", "schedule"} <= set(r)]


def write_records(path: Path, records: Iterable[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    body = json.dumps({"format": FORMAT, "jitops": __version__, "records": list(records)}, indent=1, sort_keys=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".records-")
    with os.fdopen(fd, "w") as f:
        f.write(body + "\n")
    os.replace(tmp, path)


def record_id(r: dict[str, Any]) -> tuple[str, str, str]:
    return (r.get("device", r["arch"]), r["op"], r["problem"])


class RecordStore:
    """In-memory index over the user and shipped record files, reloaded when they change."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._index: dict[tuple, tuple[float, dict]] = {}
        self.extra: list[dict[str, Any]] = []   # records embedded in a loaded bundle

    def _load(self, path: Path) -> dict:
        try:
            mtime = path.stat().st_mtime
        except OSError:
            mtime = -1.0
        cached = self._index.get((str(path),))
        if cached and cached[0] == mtime:
            return cached[1]
        table: dict = {}
        for r in read_records(path) if mtime >= 0 else []:
            table[(r["arch"], r["op"], r["problem"], r.get("device", ""))] = r
        self._index[(str(path),)] = (mtime, table)
        return table

    def lookup(self, device: DeviceInfo, op: str, problem_key: str) -> tuple[Schedule, str] | None:
        """The recorded schedule and where it came from ('user', 'bundle', 'shipped'), or None."""
        with self._lock:
            user = self._load(user_records_path())
            hit = user.get((device.arch, op, problem_key, device.key))
            if hit:
                return Schedule.from_dict(hit["schedule"]), "user"
            for r in self.extra:
                if (r["arch"], r["op"], r["problem"]) == (device.arch, op, problem_key):
                    return Schedule.from_dict(r["schedule"]), "bundle"
            shipped = self._load(shipped_records_path(device.arch))
            hit = shipped.get((device.arch, op, problem_key, device.key))
            if hit is None:
                same_arch = [r for (a, o, p, _), r in shipped.items() if (a, o, p) == (device.arch, op, problem_key)]
                hit = same_arch[0] if same_arch else None
            if hit:
                return Schedule.from_dict(hit["schedule"]), "shipped"
        return None

    def invalidate(self) -> None:
        with self._lock:
            self._index.clear()


_store = RecordStore()


def store() -> RecordStore:
    return _store
