"""Workspaces computed from inputs (Winograd-transformed filters, folded batch-norm scale and
shift), kept per input identity.

A network often has several layers of one shape with different weights. Keeping one transformed
copy per weight, least recently used first out, means each weight is transformed once rather
than on every call that alternates between them. An identity that cannot be known cheaply
(None) gets a scratch entry that is recomputed on every call.

An identity built from a device pointer (torch: pointer and version counter) only names the same
contents while the tensor it came from is alive: once it is freed, the allocator hands the same
address to the next tensor of that size, with a fresh version counter. Entries therefore hold
weak references to the tensors they were computed from and are dropped when one has died.

The native repeat path (RepeatCall) remembers entries' pointers; whatever frees or refills one
tells it (memory_released), so it forgets them before their next use.

The stream an entry was filled or used on may be gone by the time it matters (ONNX Runtime
destroys a session's stream with the session), so waiting for it is a device-wide synchronize:
rare (a new stream, an eviction) and valid whatever became of the old stream.

Inside a CUDA-graph capture a synchronize or a free would end the capture, so none happens there:
the cache grows past its byte budget instead (one warning) and evicts at the first miss after the
capture, and a stream hand-over is waited for at the next use outside it.
"""
from __future__ import annotations

import logging
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Hashable, Sequence

from .runtime.fastlaunch import memory_released

log = logging.getLogger(__name__)


@dataclass
class _Entry:
    ptrs: dict[str, int]
    nbytes: int
    stream: int
    shared: bool = False     # another stream has synchronized with the stream that filled it
    guards: list[weakref.ref] = field(default_factory=list)   # the inputs it was computed from

    def alive(self) -> bool:
        return all(g() is not None for g in self.guards)


class DerivedCache:
    # The byte budget is the real limit; the entry count only bounds bookkeeping. A cap of 32
    # entries was below what networks have: RegNetY-1.6GF runs 34 convs of one shape (its third
    # stage), so every call evicted one (a device-wide synchronize, and no CUDA-graph capture),
    # and the whole network ran 0.21x torch (H100, 2026-11-25).
    def __init__(self, workspaces: Sequence[Any], backend: Any, max_entries: int = 4096, max_bytes: int = 2 << 30):
        self.workspaces = [w for w in workspaces if w.derived_from]
        self.inputs = sorted({n for w in self.workspaces for n in w.derived_from})
        self.backend = backend
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.entries: OrderedDict[Hashable, _Entry] = OrderedDict()
        self.bytes = 0
        self.scratch: _Entry | None = None
        self.warned_over_budget = False

    def get(self, identity: Hashable | None, stream: int, sources: Sequence[Any] = ()) -> tuple[dict[str, int], bool]:
        """Pointers of the derived workspaces for inputs of this identity, and whether they must be
        (re)computed now by the plan's prepare launches. `sources`: the input objects the identity
        was read from (kept as weak references; torch tensors), when it names memory, not contents."""
        if identity is None:
            if self.scratch is None:
                self.scratch = self._allocate(stream)
            elif self.scratch.stream != stream and not self.backend.capturing(stream):
                self.backend.synchronize()          # its last users (on another stream) may still read it
                self.scratch.stream = stream
            return self.scratch.ptrs, True
        entry = self.entries.get(identity)
        if entry is not None and not entry.alive():
            # The memory it was computed from was freed and is now another tensor's: recompute in place.
            if not self.backend.capturing(stream):
                self.backend.synchronize()
            memory_released()
            entry.guards, entry.stream, entry.shared = _guards(sources), stream, False
            self.entries.move_to_end(identity)
            return entry.ptrs, True
        if entry is not None:
            self.entries.move_to_end(identity)
            if entry.stream != stream and not entry.shared and not self.backend.capturing(stream):
                self.backend.synchronize()          # filled on another stream: make sure it is done
                entry.shared = True
            return entry.ptrs, False
        need = sum(w.nbytes for w in self.workspaces)
        if self._over_budget(need):
            if self.backend.capturing(stream):
                if not self.warned_over_budget:
                    self.warned_over_budget = True
                    log.warning("derived-data cache: %d entries, %.2f GB, past its %.2f GB budget inside a "
                                "CUDA-graph capture (evicting would end the capture): it evicts at the first "
                                "miss after the capture", len(self.entries), self.bytes / 1e9, self.max_bytes / 1e9)
            else:
                self._evict(need)
        entry = self._allocate(stream)
        entry.guards = _guards(sources)
        self.entries[identity] = entry
        self.bytes += entry.nbytes
        return entry.ptrs, True

    def _over_budget(self, need: int) -> bool:
        """Whether one more entry of `need` bytes would pass the entry or byte budget (with entries to evict)."""
        return bool(self.entries) and (len(self.entries) >= self.max_entries or self.bytes + need > self.max_bytes)

    def _evict(self, need: int) -> None:
        """Least recently used first, until `need` more bytes and one more entry fit."""
        self.backend.synchronize()                  # in-flight kernels may still read them
        while self._over_budget(need):
            _, old = self.entries.popitem(last=False)
            self._free(old)

    def _allocate(self, stream: int) -> _Entry:
        ptrs, total = {}, 0
        for w in self.workspaces:
            ptrs[w.name] = self.backend.alloc(w.nbytes)
            total += w.nbytes
            if w.zero:
                self.backend.memset(ptrs[w.name], 0, w.nbytes, stream)
        return _Entry(ptrs, total, stream)

    def _free(self, entry: _Entry) -> None:
        self.bytes -= entry.nbytes
        for ptr in entry.ptrs.values():
            self.backend.free(ptr)
        memory_released()

    def release(self) -> None:
        """Free every copy (after synchronizing the streams that used them)."""
        if self.entries or self.scratch:
            self.backend.synchronize()
        for entry in [*self.entries.values(), *([self.scratch] if self.scratch else [])]:
            for ptr in entry.ptrs.values():
                self.backend.free(ptr)
        self.entries.clear()
        self.scratch = None
        self.bytes = 0
        memory_released()


def _guards(sources: Sequence[Any]) -> list[weakref.ref]:
    return [weakref.ref(s) for s in sources if s is not None]
