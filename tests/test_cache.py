"""Binary cache: hit, miss, invalidation by template edits, corruption, bad entries, concurrency."""
from __future__ import annotations

import multiprocessing as mp
import shutil
from pathlib import Path

import numpy as np
import pytest

from jitops import codegen, config
from jitops.cache import DiskCache, KernelLoader, cache_key
from jitops.errors import CompileError
from jitops.runtime import get_backend

SOURCE = r"""
JT_KERNEL void add_one(float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += 1.f;
}
"""


@pytest.fixture
def backend():
    return get_backend("cpu", warp_size=32, checked=False)


def full(backend, body=SOURCE):
    return codegen.prelude("cpu", "cpu", backend.device.warp_size) + body


def test_miss_then_disk_hit_then_memory_hit(tmp_path, backend):
    src = full(backend)
    a = KernelLoader(DiskCache(tmp_path))
    a.kernels(backend, src, ["add_one"], "add_one")
    assert (a.stats.compiles, a.stats.disk_hits) == (1, 0)
    a.kernels(backend, src, ["add_one"], "add_one")
    assert a.stats.memory_hits == 1 and a.stats.compiles == 1
    b = KernelLoader(DiskCache(tmp_path))          # a new process, in effect
    b.kernels(backend, src, ["add_one"], "add_one")
    assert (b.stats.compiles, b.stats.disk_hits) == (0, 1)


def test_key_covers_everything():
    base = dict(source="s", options=["-O2"], backend="cuda", arch="sm_90", compiler="nvrtc-13.0", kernel_names=["k"])
    k0 = cache_key(**base)
    for field, value in [("source", "s2"), ("options", ["-O3"]), ("backend", "hip"), ("arch", "sm_80"),
                         ("compiler", "nvrtc-13.1"), ("kernel_names", ["k2"])]:
        assert cache_key(**{**base, field: value}) != k0, field


def test_jitops_version_in_key(monkeypatch):
    import jitops.cache as c
    k0 = cache_key("s", [], "cuda", "sm_90", "nvrtc", ["k"])
    monkeypatch.setattr(c, "__version__", "999.0")
    assert cache_key("s", [], "cuda", "sm_90", "nvrtc", ["k"]) != k0


def test_template_edit_gives_new_key(tmp_path, monkeypatch, backend):
    tdir = tmp_path / "templates"
    shutil.copytree(config.templates_dir(), tdir)
    monkeypatch.setattr(config, "templates_dir", lambda: tdir)
    codegen.reset()
    try:
        loader = KernelLoader(DiskCache(tmp_path / "c"))
        params = {"ctype": "float", "index_type": "int", "block": 128, "kernel_name": "leaky_relu_naive"}
        s1 = codegen.full_source(backend.device, "leaky_relu/naive.hip.j2", params)
        k1 = loader.key_for(backend, s1, ["leaky_relu_naive"])
        path = tdir / "leaky_relu" / "naive.hip.j2"
        path.write_text(path.read_text().replace("v * alpha", "alpha * v"))
        codegen.reset()
        s2 = codegen.full_source(backend.device, "leaky_relu/naive.hip.j2", params)
        assert "alpha * v" in s2 and "v * alpha" in s1
        assert loader.key_for(backend, s2, ["leaky_relu_naive"]) != k1
    finally:
        monkeypatch.undo()
        codegen.reset()


def test_corrupt_entry_is_recompiled(tmp_path, backend):
    src = full(backend)
    disk = DiskCache(tmp_path)
    a = KernelLoader(disk)
    a.kernels(backend, src, ["add_one"], "add_one")
    key = a.key_for(backend, src, ["add_one"])
    entry = disk._open().get(key)
    entry["binary"] = entry["binary"][:100] + b"garbage" + entry["binary"][107:]
    disk._open().set(key, entry)
    b = KernelLoader(DiskCache(tmp_path))
    kernels = b.kernels(backend, src, ["add_one"], "add_one")
    assert b.stats.compiles == 1 and "add_one" in kernels


def test_entry_that_fails_to_load_is_recompiled(tmp_path, backend):
    src = full(backend)
    disk = DiskCache(tmp_path)
    key = KernelLoader(disk).key_for(backend, src, ["add_one"])
    disk.put(key, b"not a shared object", {})      # valid checksum, unloadable binary
    b = KernelLoader(DiskCache(tmp_path))
    kernels = b.kernels(backend, src, ["add_one"], "add_one")
    assert b.stats.reloads_after_bad_entry == 1 and b.stats.compiles == 1 and "add_one" in kernels
    assert DiskCache(tmp_path).get(key) != b"not a shared object"


def test_unusable_cache_dir_degrades_to_compiling(tmp_path, backend):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    loader = KernelLoader(DiskCache(blocker / "cache"))
    loader.kernels(backend, full(backend), ["add_one"], "add_one")
    assert loader.stats.compiles == 1


def test_compile_error_shows_log_and_saved_source(backend):
    with pytest.raises(CompileError) as info:
        KernelLoader(DiskCache(None)).kernels(backend, full(backend, SOURCE.replace("+= 1.f", "+= undefined_name")),
                                              ["add_one"], "broken")
    msg = str(info.value)
    assert "undefined_name" in msg and "rendered source saved to:" in msg
    assert Path(info.value.source_path).read_text().count("undefined_name") == 1


def _compile_in_child(cache_dir: str, barrier, results) -> None:
    import os
    os.environ["JITOPS_CACHE_DIR"] = cache_dir
    from jitops.cache import DiskCache, KernelLoader
    from jitops.runtime import get_backend
    be = get_backend("cpu", warp_size=32, checked=False)
    loader = KernelLoader(DiskCache(Path(cache_dir) / "binaries"))
    src = codegen.prelude("cpu", "cpu", 32) + SOURCE
    barrier.wait()
    k = loader.kernels(be, src, ["add_one"], "add_one")["add_one"]
    x = np.zeros(10, np.float32)
    from jitops.runtime.base import PackedArgs
    p = PackedArgs(["ptr", "i32"], ["x", "n"])
    p.set_buffer(0, x.ctypes.data, x.nbytes, 4)
    p.set(1, 10)
    be.launch(k, (1, 1, 1), (32, 1, 1), 0, p, 0)
    results.put(float(x.sum()))


def test_two_processes_compiling_the_same_kernel(tmp_path):
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(2)
    results = ctx.Queue()
    procs = [ctx.Process(target=_compile_in_child, args=(str(tmp_path), barrier, results)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert all(p.exitcode == 0 for p in procs)
    assert sorted(results.get(timeout=5) for _ in procs) == [10.0, 10.0]
