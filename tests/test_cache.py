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


# ---------------------------------------------------------------- an unusable cache location is not fatal

TINY_C = "int jitops_probe_answer(void) { return 42; }\n"
CHILD = r"""
import ctypes, io, contextlib, numpy as np, jitops
from jitops import config
from jitops.cli import main
x = np.random.default_rng(0).standard_normal(1001).astype(np.float32)
for alpha in (0.1, 0.2):                                   # two ops, two kernels: one warning
    y = jitops.leaky_relu(x, alpha)
    ref = np.where(x > 0, x, alpha * x.astype(np.float64))
    assert np.abs(y - ref).max() <= 1e-6 * np.abs(ref).max()
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    assert main(["info"]) == 0
print(buf.getvalue())
print("IN_USE", config.cache_dir())
"""


@pytest.fixture
def cache_state(monkeypatch):
    """Fresh findings about cache locations for this test, restored after it."""
    config.reset_cache_state()
    yield monkeypatch
    monkeypatch.undo()
    config.reset_cache_state()


def _tiny_library(tmp_path: Path) -> Path:
    from jitops.runtime.hostcc import build_library
    src = tmp_path / f"probe_{np.random.default_rng().integers(1 << 30)}.c"
    src.write_text(TINY_C)
    return build_library("jitops_probe", [src], ["-O0", "-shared", "-fPIC"], cxx=False)


def _answer(path: Path) -> int:
    import ctypes
    return ctypes.CDLL(str(path)).jitops_probe_answer()


def _warnings_about(records, location) -> list:
    return [r for r in records if r.levelname == "WARNING" and str(location) in r.getMessage()]


def test_first_op_call_with_cache_dir_below_a_file(tmp_path):
    """A new user's first call with JITOPS_CACHE_DIR below a file: it works, warns once, info tells."""
    import os
    import subprocess
    import sys
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    bad = blocker / "cache"
    env = {**os.environ, "JITOPS_CACHE_DIR": str(bad), "JITOPS_BACKEND": "cpu", "PYTHONWARNINGS": "default"}
    run = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    said = run.stdout + run.stderr
    assert said.count(f"jitops cache directory {bad} cannot be used") == 1, said
    assert "Not a directory" in said
    in_use = run.stdout.split("IN_USE ")[1].strip()
    assert str(bad) not in in_use
    info_line = next(line for line in run.stdout.splitlines() if line.startswith("cache "))
    assert in_use in info_line and "temporary" in info_line and str(bad) in info_line, info_line
    assert not Path(in_use).exists()          # the process's fallback is removed at exit


def _read_only_dir(path: Path, monkeypatch) -> Path:
    """A directory no file can be created in: permissions for a normal user; for root (who ignores
    them) a read-only tmpfs where mounting is allowed, else creating files there fails as on one."""
    import errno
    import os
    import subprocess
    import tempfile
    path.mkdir()
    if os.geteuid() != 0:
        path.chmod(0o555)
        return path
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(path)],
                      capture_output=True).returncode == 0:
        monkeypatch.setattr(_read_only_dir, "mounted", [*getattr(_read_only_dir, "mounted", []), path],
                            raising=False)
        return path
    real = tempfile.mkstemp

    def mkstemp(*args, dir=None, **kw):
        if dir is not None and str(dir).startswith(str(path)):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(dir))
        return real(*args, dir=dir, **kw)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    return path


def test_read_only_cache_dir_falls_back(tmp_path, cache_state, caplog):
    import subprocess
    ro = _read_only_dir(tmp_path / "ro", cache_state)
    try:
        cache_state.setenv("JITOPS_CACHE_DIR", str(ro))
        with caplog.at_level("WARNING", logger="jitops"):
            lib = _tiny_library(tmp_path)                 # where the emulator runtime build died
            disk = DiskCache()
            disk.put("k" * 64, b"binary", {})
            _tiny_library(tmp_path)
        assert _answer(lib) == 42
        assert not str(lib).startswith(str(ro)) and disk.get("k" * 64) == b"binary"
        status = config.cache_status()
        assert status["configured"] == str(ro) and status["in_use"] != str(ro) and status["reason"]
        assert len(_warnings_about(caplog.records, ro)) == 1
        assert not any(ro.iterdir())
    finally:
        for mounted in getattr(_read_only_dir, "mounted", []):
            subprocess.run(["umount", str(mounted)], capture_output=True)


def test_write_failing_midway_moves_to_the_fallback(tmp_path, cache_state, caplog):
    """A disk filling up after the location was found usable: half a file written, then ENOSPC."""
    import errno
    import os
    from jitops.runtime import hostcc
    good = tmp_path / "fills-up"
    cache_state.setenv("JITOPS_CACHE_DIR", str(good))
    assert config.cache_dir() == good                  # usable when checked
    real = hostcc._write_all
    failed = []

    def half_then_full(f, data):
        real(f, data[: len(data) // 2])
        failed.append(len(data))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    cache_state.setattr(hostcc, "_write_all", half_then_full)
    with caplog.at_level("WARNING", logger="jitops"):
        with pytest.raises(OSError):                  # the fallback fails as well: the error surfaces
            _tiny_library(tmp_path)
    assert len(failed) == 2                           # once in the configured dir, once in the fallback
    assert config.cache_status()["reason"].startswith("writing jitops_probe")
    assert not list((good / "native").iterdir())     # no half-written library, no temporary left behind
    cache_state.setattr(hostcc, "_write_all", real)
    lib = _tiny_library(tmp_path)
    assert _answer(lib) == 42 and not str(lib).startswith(str(good))
    assert len(_warnings_about(caplog.records, good)) == 1


def test_binary_cache_write_failing_midway(tmp_path, cache_state, caplog):
    import errno
    import diskcache
    good = tmp_path / "fills-up"
    cache_state.setenv("JITOPS_CACHE_DIR", str(good))
    disk = DiskCache()
    assert disk.directory == good / "binaries"
    real_set = diskcache.Cache.set

    def full_set(self, key, value, *a, **kw):
        if str(good) in self.directory:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_set(self, key, value, *a, **kw)

    cache_state.setattr(diskcache.Cache, "set", full_set)
    with caplog.at_level("WARNING", logger="jitops"):
        disk.put("a" * 64, b"first", {})
        disk.put("b" * 64, b"second", {})
    assert disk.get("a" * 64) == b"first" and disk.get("b" * 64) == b"second"
    assert str(good) not in str(disk.directory)
    assert len(_warnings_about(caplog.records, good)) == 1
    disk.close()
