"""Workspaces computed from inputs (Winograd-transformed filters, folded batch-norm scale and
shift), kept per input identity.

A network often has several layers of one shape with different weights. Keeping one transformed
copy per weight, least recently used first out, means each weight is transformed once rather
than on every call that alternates between them. An identity that cannot be known cheaply
(None) gets a scratch entry that is recomputed on every call.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Hashable, Sequence


@dataclass
class _Entry:
    ptrs: dict[str, int]
    nbytes: int
    stream: int
    shared: bool = False     # another stream has synchronized with the stream that filled it


class DerivedCache:
    def __init__(self, workspaces: Sequence[Any], backend: Any, max_entries: int = 32, max_bytes: int = 2 << 30):
        self.workspaces = [w for w in workspaces if w.derived_from]
        self.inputs = sorted({n for w in self.workspaces for n in w.derived_from})
        self.backend = backend
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.entries: OrderedDict[Hashable, _Entry] = OrderedDict()
        self.bytes = 0
        self.scratch: _Entry | None = None

    def get(self, identity: Hashable | None, stream: int) -> tuple[dict[str, int], bool]:
        """Pointers of the derived workspaces for inputs of this identity, and whether they must be
        (re)computed now by the plan's prepare launches."""
        if identity is None:
            if self.scratch is None:
                self.scratch = self._allocate(stream)
            elif self.scratch.stream != stream:
                self.backend.synchronize(self.scratch.stream)   # its last users may still be reading it
                self.scratch.stream = stream
            return self.scratch.ptrs, True
        entry = self.entries.get(identity)
        if entry is not None:
            self.entries.move_to_end(identity)
            if entry.stream != stream and not entry.shared:
                self.backend.synchronize(entry.stream)          # filled on another stream: make sure it is done
                entry.shared = True
            return entry.ptrs, False
        need = sum(w.nbytes for w in self.workspaces)
        while self.entries and (len(self.entries) >= self.max_entries or self.bytes + need > self.max_bytes):
            _, old = self.entries.popitem(last=False)
            self.backend.synchronize(old.stream)                # in-flight kernels may still read it
            self._free(old)
        entry = self._allocate(stream)
        self.entries[identity] = entry
        self.bytes += entry.nbytes
        return entry.ptrs, True

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

    def release(self) -> None:
        """Free every copy (after synchronizing the streams that used them)."""
        for entry in [*self.entries.values(), *([self.scratch] if self.scratch else [])]:
            self.backend.synchronize(entry.stream)
            for ptr in entry.ptrs.values():
                self.backend.free(ptr)
        self.entries.clear()
        self.scratch = None
        self.bytes = 0
