"""The public functions as native entries (native_entry.py, Entry in runtime/native/jitops_dispatch.c):
the Python function's signature, docs and errors; the inputs and attributes each hands its
Dispatch are the ones the Python function hands repeat_call; a repeat call runs no Python frame of
jitops; everything else (out=, schedule=, layout=, unknown keywords, another backend) takes the
Python function. Probe backend: launches are recorded, nothing runs."""
from __future__ import annotations

import inspect
import pickle
import pydoc
import sys
from pathlib import Path

import pytest

import jitops
from jitops import api, engine, native_entry
from jitops.runtime import use_backend

torch = pytest.importorskip("torch")
OPS = ["leaky_relu", "conv2d", "attention", "batch_norm", "group_norm", "layer_norm", "rms_norm"]
native = pytest.mark.skipif(not hasattr(jitops.leaky_relu, "fallback"), reason="native module unavailable")


def calls(backend) -> int:
    return backend.native.probe_last(0)[0]


@native
@pytest.mark.parametrize("name", OPS)
def test_entry_looks_like_its_python_function(name):
    entry = getattr(jitops, name)
    fn = entry.fallback
    assert entry is getattr(api, name) and inspect.isfunction(fn) and entry.__wrapped__ is fn
    assert inspect.signature(entry) == inspect.signature(fn)
    assert entry.__doc__ == fn.__doc__ and entry.__name__ == name and entry.__module__ == "jitops.api"
    text = pydoc.render_doc(entry)
    assert str(inspect.signature(fn)) in text and fn.__doc__.splitlines()[0] in text
    assert pickle.loads(pickle.dumps(entry)) is entry


def sentinel_call(name, monkeypatch, *args, **kwargs):
    """What the Python function passes to repeat_call for this call (engine.run stubbed)."""
    seen = []
    monkeypatch.setattr(api, "repeat_call", lambda op, values, attrs: seen.append((op, values, attrs)) or engine.MISS)
    monkeypatch.setattr(engine, "run", lambda *a, **k: None)
    fn = getattr(jitops, name)
    getattr(fn, "fallback", fn)(*args, **kwargs)
    monkeypatch.undo()
    return seen


@pytest.mark.parametrize("name", OPS)
def test_split_matches_what_the_python_function_passes(name, monkeypatch):
    """Distinct objects for every parameter, positionally and by keyword: the entry's model
    (native_entry.split) sorts them exactly as the function's own repeat_call tuples."""
    fn = getattr(jitops, name)
    fn = getattr(fn, "fallback", fn)
    params = [p for p in inspect.signature(fn).parameters.values() if p.name not in native_entry.ENGINE_KEYWORDS]
    marks = {p.name: object() for p in params}
    positional = [marks[p.name] for p in params if p.kind == p.POSITIONAL_OR_KEYWORD]
    keyword_only = {p.name: marks[p.name] for p in params if p.kind == p.KEYWORD_ONLY}
    for args, kwargs in ((positional, keyword_only), ((), dict(marks)), (positional[:1], {
            **{p.name: marks[p.name] for p in params[1:]}})):
        seen = sentinel_call(name, monkeypatch, *args, **kwargs)
        assert seen == [(name, *native_entry.split(fn, *args, **kwargs))]
    assert native_entry.split(fn, *positional, out=object()) is None
    assert native_entry.split(fn, *positional, bogus=1) is None


CASES = {
    "leaky_relu": lambda t: ((t(4, 100),), dict(alpha=0.2)),
    "conv2d": lambda t: ((t(1, 8, 12, 12), t(8, 1, 3, 3), t(8)), dict(groups=8, padding=1, activation="relu")),
    "conv2d-winograd": lambda t: ((t(1, 16, 12, 12), t(16, 16, 3, 3), t(16)), dict(padding=1)),
    "batch_norm": lambda t: ((t(2, 8, 5, 5), t(8), t(8).abs() + 0.5, t(8), t(8)), dict(eps=1e-3)),
    "attention": lambda t: ((t(2, 16, 32), t(2, 16, 32), t(2, 16, 32)), dict(causal=True)),
    "group_norm": lambda t: ((t(2, 8, 5, 5), 4, t(8), t(8)), dict(eps=1e-3)),
    "layer_norm": lambda t: ((t(6, 64), 64, t(64), t(64)), dict(eps=1e-3)),
    "rms_norm": lambda t: ((t(6, 64), 64, t(64)), dict(eps=1e-3)),
}


@native
@pytest.mark.parametrize("case", list(CASES))
def test_repeat_call_runs_no_python_frame_of_jitops(probe, case):
    args, kwargs = CASES[case](lambda *shape: torch.randn(*shape))
    fn = getattr(jitops, case.split("-")[0])
    fn(*args, **kwargs)
    fn(*args, **kwargs)         # derived data and per-stream scratch remembered
    frames = []
    package = str(Path(jitops.__file__).parent)

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(package):
            frames.append(f"{frame.f_code.co_filename}:{frame.f_code.co_name}")

    before = calls(probe)
    sys.setprofile(profile)
    try:
        y = fn(*args, **kwargs)
    finally:
        sys.setprofile(None)
    assert calls(probe) > before and isinstance(y, torch.Tensor)
    assert frames == []


@native
def test_positional_keyword_and_default_spellings_share_one_repeat_call(probe, monkeypatch):
    x, w, b = torch.randn(1, 8, 12, 12), torch.randn(8, 1, 3, 3), torch.randn(8)
    jitops.conv2d(x, w, b, 1, 1, 1, 8)
    monkeypatch.setattr(engine, "run", lambda *a, **k: pytest.fail("general path taken"))
    for call in (lambda: jitops.conv2d(x, w, b, 1, 1, 1, 8), lambda: jitops.conv2d(x, w, b, padding=1, groups=8),
                 lambda: jitops.conv2d(groups=8, x=x, w=w, bias=b, stride=1, padding=1, alpha=0.01),
                 lambda: jitops.conv2d(x, w, b, groups=8, padding=1, residual=None, out=None, schedule=None)):
        before = calls(probe)
        y = call()
        assert calls(probe) == before + 1 and probe.native.probe_last(2)[6][:2] == [x.data_ptr(), w.data_ptr()]
        assert y.shape == (1, 8, 12, 12)


@native
def test_everything_else_takes_the_python_function(probe, monkeypatch):
    x = torch.randn(256)
    jitops.leaky_relu(x, 0.1)
    seen = []
    real = engine.run
    monkeypatch.setattr(engine, "run", lambda *a, **k: seen.append(a[0]) or real(*a, **k))
    out = torch.full_like(x, float("nan"))
    assert jitops.leaky_relu(x, 0.1, out=out) is out                          # out=
    jitops.leaky_relu(x, 0.1, schedule="naive")                               # schedule=
    jitops.leaky_relu(x, 0.2)                                                 # another attribute
    assert seen == ["leaky_relu"] * 3
    with pytest.raises(TypeError, match="leaky_relu\\(\\) got an unexpected keyword argument 'bogus'"):
        jitops.leaky_relu(x, bogus=1)
    with pytest.raises(TypeError, match="multiple values for argument 'alpha'"):
        jitops.leaky_relu(x, 0.1, alpha=0.1)
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'x'"):
        jitops.leaky_relu()
    with pytest.raises(jitops.ArgumentError):
        jitops.leaky_relu(x, 0.1, layout="nhwc")                              # layout=: the Python checks
    from jitops.runtime.probe_backend import ProbeBackend
    other = ProbeBackend()
    with use_backend(other):                                                  # another backend: a miss
        seen.clear()
        jitops.leaky_relu(x, 0.1)
        assert seen == ["leaky_relu"]
        assert engine.repeat_call("leaky_relu", (x,), (0.1,)) is not engine.MISS   # now bound there too


def test_without_the_native_module_the_python_functions_are_public(tmp_path):
    """No C compiler for the launcher (CC=false, empty cache, no prebuilt copy in a checkout):
    `import jitops` stays quiet and exports the Python functions; the first plain request for the
    launcher warns once, naming what is missing."""
    import os
    import subprocess
    child = ("import inspect, warnings, jitops\n"
             "from jitops.runtime import fastlaunch\n"
             "print('PYTHON', all(inspect.isfunction(getattr(jitops, n)) for n in %r))\n"
             "with warnings.catch_warnings(record=True) as w:\n"
             "    warnings.simplefilter('always')\n"
             "    found = [fastlaunch.native_launcher(), fastlaunch.native_launcher()]\n"
             "print('ORIGIN', fastlaunch.origin or '-', found == [None, None])\n"
             "print('WARNED', len(w), str(w[0].message) if w else '')\n") % (OPS,)
    env = {**os.environ, "CC": "false", "JITOPS_CACHE_DIR": str(tmp_path / "cache"), "JITOPS_BACKEND": "cpu"}
    run = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    if "ORIGIN prebuilt" in run.stdout:
        pytest.skip("an installed prebuilt launcher is used")
    assert "ORIGIN - True" in run.stdout and "PYTHON True" in run.stdout and "native launcher" not in run.stderr
    assert "WARNED 1 jitops native launcher unavailable" in run.stdout
