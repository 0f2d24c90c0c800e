"""The custom-op library: built from native/*.cc with the host compiler once, then connected to jitops.

`library_path()` builds (or finds in the cache) libjitops_ort-<hash>.so. `connect()` loads that same
file with ctypes and hands it the jitops node types and three callbacks; ONNX Runtime, loading the
same path with register_custom_ops_library, gets the same (already connected) library image.
"""
from __future__ import annotations

import atexit
import ctypes
import hashlib
import logging
import threading
from pathlib import Path

from .. import config
from ..errors import BackendUnavailable, JitopsError
from ..runtime.hostcc import build_library
from .optypes import DOMAIN, OP_TYPES

log = logging.getLogger("jitops.onnx")

SOURCE_DIR = Path(__file__).resolve().parent / "native"
MAX_RANK = 8
KIND = {"int": "i", "float": "f", "string": "s", "ints": "I", "floats": "F"}


class JtTensor(ctypes.Structure):
    """Mirror of JtTensor in native/jitops_ort.cc."""

    _fields_ = [("data", ctypes.c_void_p), ("dims", ctypes.c_int64 * MAX_RANK), ("ndim", ctypes.c_int32),
                ("elem_type", ctypes.c_int32)]


CREATE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_char_p,
                          ctypes.POINTER(ctypes.c_int64), ctypes.c_void_p, ctypes.c_size_t)
COMPUTE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(JtTensor),
                           ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
DESTROY = ctypes.CFUNCTYPE(None, ctypes.c_int64)

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_callbacks: tuple = ()   # kept alive for as long as the library may call them
_warned: list[Path] = []


def sources_digest() -> str:
    """Hash of the library's sources: what a prebuilt copy (in a bundle) must have been built from."""
    h = hashlib.sha256()
    for name in ("ort_abi.h", "jitops_ort.cc"):
        h.update((SOURCE_DIR / name).read_bytes())
    return h.hexdigest()[:16]


def library_path() -> Path:
    """The custom-op library for ONNX Runtime: the copy built with the wheel, else built with the
    host C++ compiler on first use.

    On a host without a compiler, the copy carried by a loaded bundle is used when it was built
    from these same sources.
    """
    prebuilt = SOURCE_DIR.parent / f"libjitops_ort-{sources_digest()}.so"   # built with the wheel (setup.py)
    if prebuilt.is_file():
        return prebuilt
    try:
        built = build_library("libjitops_ort", [SOURCE_DIR / "jitops_ort.cc"],
                              ["-std=c++17", "-O2", "-fPIC", "-shared", "-pthread", "-fvisibility=hidden",
                               f"-I{SOURCE_DIR}", f"-DJITOPS_ORT_SOURCES_{sources_digest()}"])
        if not config.is_checkout() and not _warned:
            _warned.append(built)
            config.warn(log, f"jitops ONNX Runtime library: no prebuilt copy in this installation (the wheel was "
                             f"built without a C++ compiler?); built {built.name} with the host compiler instead")
        return built
    except BackendUnavailable:
        from ..bundle import loaded_bundles
        for bundle in loaded_bundles():
            prebuilt = bundle.native_library()
            if prebuilt is not None:
                return prebuilt
        raise


def type_spec() -> str:
    """The node types, one line each: name;n_inputs;optional_mask;n_outputs;attr:kind,..."""
    lines = []
    for t in OP_TYPES.values():
        mask = sum(1 << i for i, n in enumerate(t.inputs) if n in t.optional)
        attrs = ",".join(f"{a.name}:{KIND[a.kind]}" for a in t.attrs)
        lines.append(f"{t.name};{len(t.inputs)};{mask};{len(t.outputs)};{attrs}")
    return "\n".join(lines)


def write_error(buf: int, size: int, message: str) -> None:
    data = message.encode("utf-8", "replace")[: max(0, size - 1)]
    ctypes.memmove(buf, data, len(data))
    ctypes.memset(buf + len(data), 0, 1)


def connect() -> ctypes.CDLL:
    """Load the library into this process and point it at the jitops kernels (idempotent)."""
    global _lib, _callbacks
    from . import kernels
    with _lock:
        if _lib is not None:
            if kernels._lib is not _lib:     # rebound meanwhile (tests put a fake ORT in its place)
                kernels.bind_library(_lib)
            return _lib
        path = library_path()
        lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_LOCAL)
        lib.jitops_ort_configure.argtypes = [ctypes.c_char_p, ctypes.c_char_p, CREATE, COMPUTE, DESTROY,
                                             ctypes.c_void_p, ctypes.c_size_t]
        lib.jitops_ort_configure.restype = ctypes.c_int
        lib.jitops_ort_output.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int64),
                                          ctypes.c_int]
        lib.jitops_ort_output.restype = ctypes.c_void_p
        lib.jitops_ort_shutdown.argtypes = []
        lib.jitops_ort_replay_new.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        lib.jitops_ort_replay_new.restype = ctypes.c_void_p
        lib.jitops_ort_replay_free.argtypes = [ctypes.c_void_p]
        lib.jitops_ort_replay_run.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
        lib.jitops_ort_replay_run.restype = ctypes.c_int
        lib.jitops_ort_keep_replay.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        lib.jitops_ort_keep_replay.restype = ctypes.c_int
        lib.jitops_ort_invalidate.argtypes = []
        callbacks = (CREATE(kernels.create_callback), COMPUTE(kernels.compute_callback),
                     DESTROY(kernels.destroy_callback))
        err = ctypes.create_string_buffer(4096)
        rc = lib.jitops_ort_configure(type_spec().encode(), DOMAIN.encode(), *callbacks,
                                      ctypes.addressof(err), len(err))
        if rc != 0:
            raise JitopsError(f"jitops ONNX Runtime library {path} refused its configuration: {err.value.decode()}")
        kernels.bind_library(lib)
        _callbacks = callbacks
        _lib = lib
        atexit.register(lib.jitops_ort_shutdown)
        log.info("jitops custom-op library connected: %s", path)
        return lib
