"""The native repeat-call path (runtime/native/jitops_launch.c: RepeatCall, Dispatch) on the probe
backend: kernels compile and load like the emulator's, launches are recorded, nothing runs. What
is checked: each repeat call launches with its own arrays' pointers and the plan's scalars; a call
whose signature differs takes the general path (and its errors); every public function finds its
repeat path (derived data and per-call scratch included); launch failures raise; clear_prepared
forgets the native calls; derived data is recomputed exactly when its inputs change or die."""
from __future__ import annotations

import struct

import numpy as np
import pytest

import jitops
from jitops import engine
from jitops.errors import ArgumentError, LaunchError
from jitops.ops import get_op

torch = pytest.importorskip("torch")


def last_launch(backend, nargs):
    calls, kernel, grid, block, shared, stream, values = backend.native.probe_last(nargs)
    return calls, grid, block, values


def f32(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits & 0xFFFFFFFF))[0]


def test_repeat_calls_launch_with_their_own_pointers(probe):
    xs = [torch.randn(4096) for _ in range(3)]
    jitops.leaky_relu(xs[0], 0.25)                       # general path, binds
    bound = next(b for k, b in engine._cache.bound.items() if b and k[1] is probe)
    assert bound.native is not None and len(engine._cache.dispatch["leaky_relu"]) == 1
    outs = []
    for x in xs:
        before = last_launch(probe, 4)[0]
        y = jitops.leaky_relu(x, 0.25)
        calls, grid, block, values = last_launch(probe, 4)
        assert calls == before + 1
        assert values[0] == x.data_ptr() and values[1] == y.data_ptr()
        assert values[2] == 4096 and f32(values[3]) == pytest.approx(0.25)
        assert y.shape == x.shape and y.dtype == x.dtype
        assert y.data_ptr() not in [o.data_ptr() for o in outs]      # a fresh output every call
        outs.append(y)


def test_other_signatures_take_the_general_path(probe):
    x = torch.randn(64, 32)
    jitops.leaky_relu(x, 0.1)
    jitops.leaky_relu(torch.randn(64, 33), 0.1)         # another shape: another bound call
    jitops.leaky_relu(x.half(), 0.1)                     # another dtype
    jitops.leaky_relu(x, 0.5)                            # another attribute
    assert len(engine._cache.dispatch["leaky_relu"]) == 4
    y = jitops.leaky_relu(x, 0.5)
    assert f32(last_launch(probe, 4)[3][3]) == pytest.approx(0.5)
    assert last_launch(probe, 4)[3][1] == y.data_ptr()
    with pytest.raises(ArgumentError, match="contiguous"):
        jitops.leaky_relu(x.t(), 0.1)                    # same shape class, strided: refused, not launched
    with pytest.raises(ArgumentError):
        jitops.leaky_relu(x.to(torch.int32), 0.1)


CASES = {
    "leaky_relu": lambda t: ((t(4, 100),), dict(alpha=0.2)),
    # depthwise: the direct kernel, no derived weights
    "conv2d": lambda t: ((t(1, 8, 12, 12), t(8, 1, 3, 3), t(8)), dict(groups=8, padding=1, activation="relu")),
    # Winograd (transformed filters: derived data; per-call scratch), split-K 1x1 (packed weights, partials)
    "conv2d-winograd": lambda t: ((t(1, 16, 12, 12), t(16, 16, 3, 3), t(16)), dict(padding=1)),
    "conv2d-split-k": lambda t: ((t(1, 16, 8, 8), t(32, 16, 1, 1), None), dict()),
    "batch_norm": lambda t: ((t(2, 8, 5, 5), t(8), t(8).abs() + 0.5, t(8), t(8)), dict(eps=1e-3)),
    "attention": lambda t: ((t(2, 16, 32), t(2, 16, 32), t(2, 16, 32)), dict(causal=True)),
    "group_norm": lambda t: ((t(2, 8, 5, 5), 4, t(8), t(8)), dict(eps=1e-3)),
    "layer_norm": lambda t: ((t(6, 64), 64, t(64), t(64)), dict(eps=1e-3)),
    "rms_norm": lambda t: ((t(6, 64), 64, t(64)), dict(eps=1e-3)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_public_function_finds_its_repeat_path(probe, monkeypatch, case):
    """The tuples each public function passes to repeat_call must list inputs and attributes in
    the order engine.run registered them; a mismatch would silently cost the slow path."""
    args, kwargs = CASES[case](lambda *shape: torch.randn(*shape))
    op_name = case.split("-")[0]
    fn = getattr(jitops, op_name)
    fn(*args, **kwargs)
    assert len(engine._cache.dispatch.get(op_name, ())) == 1, "no native repeat path for this problem"

    def no_general_path(*a, **k):
        raise AssertionError("engine.run called: the repeat path did not match")

    monkeypatch.setattr(engine, "run", no_general_path)
    before = last_launch(probe, 1)[0]
    y = fn(*args, **kwargs)
    assert last_launch(probe, 1)[0] > before and isinstance(y, torch.Tensor)


def test_launch_failure_raises_and_recovers(probe):
    x = torch.randn(1000)
    jitops.leaky_relu(x)
    probe.native.probe_set_status(719)
    with pytest.raises(LaunchError, match="719"):
        jitops.leaky_relu(x)
    probe.native.probe_set_status(0)
    assert jitops.leaky_relu(x).shape == x.shape


def test_clear_prepared_forgets_native_calls(probe, monkeypatch):
    x = torch.randn(1000)
    jitops.leaky_relu(x)
    engine.clear_prepared()
    assert not any(len(d) for d in engine._cache.dispatch.values())     # emptied (the entries hold them)
    seen = []
    real = engine._run_general
    monkeypatch.setattr(engine, "_run_general", lambda *a, **k: seen.append(1) or real(*a, **k))
    jitops.leaky_relu(x)
    assert seen == [1]


def test_emulator_results_unchanged_by_the_probe(emu):
    """The emulator never takes the native path (it reads buffer sizes); results still match."""
    x = torch.randn(300)
    for _ in range(2):
        y = jitops.leaky_relu(x, 0.3)
        np.testing.assert_allclose(y.numpy(), np.where(x > 0, x, 0.3 * x), rtol=1e-6)
    assert not len(engine._cache.dispatch["leaky_relu"])
    assert get_op("leaky_relu") is not None


# ---------------------------------------------------------------- derived data and scratch in C

def bound_for(op_name, backend):
    return next(b for k, b in reversed(engine._cache.bound.items()) if b and k[0] == op_name and k[1] is backend)


def launches(backend):
    return last_launch(backend, 0)[0]


def workspace_arg(bound, backend, names):
    """The pointer of one of the named workspaces, as the last main launch reading it received it."""
    step, index = next((step, i) for step, slots in bound.steps for i, where, _ in slots if where in names)
    return backend.native.probe_args(step.kernel.handle, len(step.packed.values))[index]


def derived_arg(bound, backend):
    return workspace_arg(bound, backend, {w.name for w in bound.derived.workspaces})


@pytest.mark.parametrize("case", ["conv2d-winograd", "conv2d-split-k", "batch_norm"])
def test_derived_data_recomputed_exactly_when_its_inputs_change(probe, monkeypatch, case):
    t = lambda *shape: torch.randn(*shape)              # noqa: E731
    args, kwargs = CASES[case](t)
    op_name = case.split("-")[0]
    fn = getattr(jitops, op_name)
    fn(*args, **kwargs)                                  # general path: binds, fills the derived data
    bound = bound_for(op_name, probe)
    assert bound.native is not None and bound.derived is not None and bound.prepare_steps
    main, prep = len(bound.steps), len(bound.prepare_steps)
    src = bound.fingerprint_inputs[0]                   # the weight (conv2d) or mean (batch_norm)
    monkeypatch.setattr(engine, "run", lambda *a, **k: pytest.fail("general path taken"))

    def call(new_args):
        before = launches(probe)
        fn(*new_args, **kwargs)
        return launches(probe) - before, derived_arg(bound, probe)

    n, first_ptr = call(args)
    assert n in (main, main + prep)                     # C may ask Python once (the Python path filled it)
    assert call(args) == (main, first_ptr)              # remembered in C: no prepare launch

    other = list(args)
    other[src] = t(*args[src].shape)                     # a second layer of the same shape
    n, other_ptr = call(other)
    assert n == main + prep and other_ptr != first_ptr
    for _ in range(2):                                   # alternating layers: both remembered
        assert call(args) == (main, first_ptr)
        assert call(other) == (main, other_ptr)

    args[src].add_(1.0)                                  # in place: version counter bumped
    n, changed_ptr = call(args)
    assert n == main + prep                              # recomputed (a new identity, a new entry)
    assert call(args) == (main, changed_ptr)

    base = torch.randn(args[src].numel() * 2)           # views of one buffer: same pointer, same version
    view = base[: args[src].numel()].view(args[src].shape)
    mixed = list(args)
    mixed[src] = view
    n, view_ptr = call(mixed)
    assert n == main + prep
    assert call(mixed)[0] == main
    del view, mixed
    mixed = list(args)
    mixed[src] = base[: args[src].numel()].view(args[src].shape)   # the first view died: not trusted
    assert call(mixed)[0] == main + prep


def test_repeat_calls_allocate_only_outputs_and_never_synchronize(probe, monkeypatch):
    """CUDA-graph friendliness: no device allocation (scratch kept per stream, derived data
    remembered), no synchronize, on a repeat call."""
    args, kwargs = CASES["conv2d-winograd"](lambda *shape: torch.randn(*shape))
    jitops.conv2d(*args, **kwargs)
    jitops.conv2d(*args, **kwargs)
    bound = bound_for("conv2d", probe)
    temps = {w.name for w in bound.temps}
    assert temps, "this case should have per-call scratch"
    scratch = workspace_arg(bound, probe, temps)
    monkeypatch.setattr(probe, "alloc", lambda *a: pytest.fail("device allocation on a repeat call"))
    monkeypatch.setattr(probe, "synchronize", lambda *a: pytest.fail("synchronize on a repeat call"))
    monkeypatch.setattr(probe, "memset", lambda *a: pytest.fail("memset on a repeat call"))
    outs = [jitops.conv2d(*args, **kwargs) for _ in range(3)]
    assert workspace_arg(bound, probe, temps) == scratch
    assert len({o.data_ptr() for o in outs}) == 3


def test_freed_derived_memory_is_never_used(probe):
    """A RepeatCall held past clear_prepared (which frees derived data and scratch) asks again."""
    args, kwargs = CASES["batch_norm"](lambda *shape: torch.randn(*shape))
    jitops.batch_norm(*args, **kwargs)
    bound = bound_for("batch_norm", probe)
    native = bound.native
    main, prep = len(bound.steps), len(bound.prepare_steps)
    before = launches(probe)
    native(tuple(args))
    native(tuple(args))
    assert launches(probe) - before == 2 * main
    engine.clear_prepared()
    before = launches(probe)
    native(tuple(args))
    assert launches(probe) - before == main + prep       # refilled, not the freed entry


def test_dispatch_finds_any_of_many_signatures(probe, monkeypatch):
    """Found by hash, not among the newest few: 40 shapes bound, every one repeats natively."""
    xs = [torch.randn(64 + k) for k in range(40)]
    for x in xs:
        jitops.leaky_relu(x, 0.1)
    assert len(engine._cache.dispatch["leaky_relu"]) == 40
    monkeypatch.setattr(engine, "run", lambda *a, **k: pytest.fail("general path taken"))
    for x in reversed(xs):
        y = jitops.leaky_relu(x, 0.1)
        assert last_launch(probe, 2)[3] == [x.data_ptr(), y.data_ptr()]
    monkeypatch.undo()
    seen = []
    real = engine._run_general
    monkeypatch.setattr(engine, "_run_general", lambda *a, **k: seen.append(1) or real(*a, **k))
    jitops.leaky_relu(xs[0], 0.2)                        # another attribute: a miss, the general path
    assert seen == [1]


def test_released_bound_calls_are_freed(probe):
    """A bound call with derived data and scratch is freed once the engine drops it (its RepeatCall's
    callbacks must not keep it alive: RepeatCall takes no part in garbage collection)."""
    import gc
    import weakref
    args, kwargs = CASES["conv2d-winograd"](lambda *shape: torch.randn(*shape))
    jitops.conv2d(*args, **kwargs)
    jitops.conv2d(*args, **kwargs)
    bound = weakref.ref(bound_for("conv2d", probe))
    assert bound().native is not None and len(bound().scratch_table)
    engine.clear_prepared()
    gc.collect()
    assert bound() is None


def test_persistent_workspaces_are_per_stream_on_the_repeat_path(probe, monkeypatch):
    """A plan's persistent workspaces (here layer_norm's split path: grid-barrier counters, partials,
    statistics) are allocated once per stream: the C repeat call asks for them on a stream's first
    call and launches with that stream's copy from then on."""
    from jitops import bound_plan
    from jitops.ops import layer_norm as ln
    stream = [7]
    monkeypatch.setattr(bound_plan, "_no_stream", lambda: stream[0])
    real = ln.heuristic
    monkeypatch.setattr(ln, "heuristic", lambda problem, device, algorithm=None: real(problem, device, "split"))
    x = torch.randn(4, 512)
    jitops.layer_norm(x, 512)                        # the general path binds the repeat call
    prepared = next(b for k, b in engine._cache.bound.items() if b and k[1] is probe).prepared
    seen, nargs = {}, len(prepared.steps[-1].packed.values)
    for s in (7, 9, 7, 9):
        stream[0] = s
        jitops.layer_norm(x, 512)
        _, _, _, values = last_launch(probe, nargs)
        kept = {name: ptr for (st, name), ptr in prepared.persistent.items() if st == s}
        assert set(kept) == {"counters", "partials", "stats"}
        assert kept["stats"] in values, "the launch reads this stream's statistics"
        assert seen.setdefault(s, kept) == kept, "a stream keeps its copy"
    assert not set(seen[7].values()) & set(seen[9].values())


def test_tensor_maps_encoded_per_pointer_and_copied_with_the_arguments():
    """A RepeatCall step with a tensor-map argument (TMA kernels: 128 bytes encoded over a pointer):
    the launch reads a map encoded for this call's pointer; the encoder runs only when the pointer
    changes; an encoder returning anything but 128 bytes raises instead of launching."""
    from jitops.runtime.fastlaunch import native_launcher
    module = native_launcher()
    if module is None:
        pytest.skip("no native launcher (no host C compiler)")
    encoded = []

    def encode(ptr: int) -> bytes:
        encoded.append(ptr)
        return struct.pack("<QQ", ptr ^ 0x5A5A, 7) + bytes(112)

    storage = struct.pack("<QQQ", 0, 0, 42)          # pointer, tensor map (placeholder), a scalar
    step = (module.probe_entry(), 0xC0FFEE, (3, 1, 1), (128, 1, 1), 0, storage, [(0, 0)], [(1, 0, encode)])
    expect = (None,)

    def call_for(step_spec):
        return module.RepeatCall(1, [(lambda: torch.empty(1), -1)], lambda: 0, None,
                                 lambda *a: pytest.fail(f"launch failed: {a}"), [step_spec], expect)

    call = call_for(step)
    xs = [torch.randn(64), torch.randn(64)]
    for x, encodes in ((xs[0], 1), (xs[0], 1), (xs[1], 2), (xs[1], 2), (xs[0], 3)):
        call((x,))
        _, kernel, grid, block, _, _, values = module.probe_last(3)
        assert values[0] == x.data_ptr()                     # the pointer slot
        assert values[1] == x.data_ptr() ^ 0x5A5A           # the map's first 8 bytes: encoded for this pointer
        assert values[2] == 42 and kernel == 0xC0FFEE and grid == (3, 1, 1) and block == (128, 1, 1)
        assert len(encoded) == encodes and encoded[-1] == x.data_ptr()
    bad = call_for(step[:7] + ([(1, 0, lambda ptr: bytes(64))],))
    before = module.probe_last(3)[0]
    with pytest.raises(ValueError, match="128"):
        bad((xs[0],))
    assert module.probe_last(3)[0] == before                      # nothing launched
    with pytest.raises(ValueError, match="tensor map"):
        call_for(step[:7] + ([(5, 0, encode)],))                  # no argument 5
