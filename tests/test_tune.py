"""The tuner on the CPU emulator: end to end, record reuse, planted failures, compile timeouts, budget."""
from __future__ import annotations

import json
import sys
import time
import types
from dataclasses import replace

import numpy as np
import pytest

import jitops
from jitops import config, engine, records
from jitops.ops import get_op
from jitops.ops.base import Plan, Schedule, TensorSpec
from jitops.records import store
from jitops.runtime import get_backend, use_backend
from jitops.tuning import problem_from_args, space
from jitops.tuning.compile_pool import CompileJob, CompilePool
from jitops.tuning.tuner import TuneOptions, tune_problems

LR = get_op("leaky_relu")


pytestmark = pytest.mark.usefixtures("isolated")   # conftest: private records for every test


@pytest.fixture
def cpu():
    backend = get_backend("cpu", warp_size=32)
    with use_backend(backend):
        yield backend


def test_tune_end_to_end_on_the_emulator_then_reuse(cpu, isolated):
    t0 = time.monotonic()
    r = jitops.tune("leaky_relu", x=(4096,), dtype="float32", max_candidates=4, workers=2, budget=None)
    assert r.source == "tuned" and r.schedule is not None
    assert r.time_us and r.heuristic_us and r.time_us <= r.heuristic_us
    assert len(r.candidates) == 4 and all(c.status == "ok" for c in r.candidates)
    winner = next(c for c in r.candidates if c.schedule == r.schedule)
    assert winner.checked is True             # checked before it could win
    rec = json.loads(isolated[0].read_text())["records"][0]
    assert rec["arch"] == "cpu-w32" and rec["op"] == "leaky_relu" and rec["problem"] == r.key
    assert rec["check"]["passed"] and rec["check"]["reference"] == "float64"
    assert rec["heuristic"]["time_us"] > 0 and len(rec["runners_up"]) == 3 and rec["jitops"] == jitops.__version__
    first = time.monotonic() - t0

    # Later calls of the same problem use the winner.
    sched, origin = engine.select_schedule(LR, r.problem, cpu.device)
    assert (sched, origin) == (r.schedule, "user")
    x = np.random.default_rng(0).standard_normal(4096).astype(np.float32)
    np.testing.assert_array_equal(jitops.leaky_relu(x), np.where(x > 0, x, np.float32(0.01) * x))

    # Tuning again answers from the record, without compiling or timing anything.
    t1 = time.monotonic()
    again = jitops.tune("leaky_relu", x=(4096,), dtype="float32")
    assert again.source == "record (user)" and again.schedule == r.schedule and again.time_us == rec["time_us"]
    reuse = time.monotonic() - t1
    assert reuse < min(1.0, first / 3), (reuse, first)
    forced = jitops.tune("leaky_relu", x=(4096,), dtype="float32", max_candidates=2, force=True, save=False)
    assert forced.source == "tuned"


def test_problem_from_arrays_matches_the_spec_form():
    x = np.zeros((16, 256), dtype=np.float16)
    a = problem_from_args(LR, x=x, alpha=0.2)
    b = problem_from_args(LR, x="4096", dtype="float16", alpha="0.2")
    c = problem_from_args(LR, x=TensorSpec((4096,), "float16"), alpha=0.2)
    assert a.key() == b.key() == c.key()
    with pytest.raises(TypeError):
        problem_from_args(LR, a, x=x)


# ---------------------------------------------------------------- planted failures

def _fake_op() -> types.ModuleType:
    """leaky_relu with four extra candidates: one that does not compile, one that is fast and
    wrong (covers a sliver of the tensor; the rest stays NaN), one the op cannot plan, and one that
    asks for more threads than a block may have."""
    op = types.ModuleType("fake_leaky")
    op.NAME, op.INPUTS = "fake_leaky", LR.INPUTS
    for name in ("make_problem", "parse_problem", "heuristic", "reference", "random_inputs", "tolerance"):
        setattr(op, name, getattr(LR, name))
    broken = Schedule.make("broken")
    fast_wrong = Schedule.make("fast_wrong")
    unplannable = Schedule.make("unplannable")
    too_big = Schedule.make("too_big")

    def candidates(problem, device):
        return [fast_wrong, broken, unplannable, too_big, LR.heuristic(problem, device, "naive")]

    def plan(problem, schedule, device):
        if schedule.algorithm in ("vectorized", "naive"):
            return LR.plan(problem, schedule, device)
        base = LR.plan(problem, Schedule.make("naive", block=256), device).launches[0]
        params = dict(base.params)
        if schedule.algorithm == "broken":
            params["ctype"] = "this_is_not_a_type"
            return Plan((replace(base, params=tuple(sorted(params.items()))),))
        if schedule.algorithm == "fast_wrong":
            return Plan((replace(base, grid=(1, 1, 1)),))
        if schedule.algorithm == "too_big":
            return Plan((replace(base, block=(4096, 1, 1)),))
        raise jitops.ScheduleError("this schedule does not apply")

    op.candidates, op.plan = candidates, plan
    return op


def test_failing_candidates_never_win(cpu, isolated):
    op = _fake_op()
    problem = op.make_problem({"x": TensorSpec((8192,), "float32")}, {"alpha": 0.1})
    [r] = tune_problems([(op, problem)], cpu, TuneOptions(budget_s=None, workers=2, top_k=6))
    status = {c.schedule.algorithm: c.status for c in r.candidates}
    assert status == {"vectorized": "ok", "fast_wrong": "wrong", "broken": "compile_failed",
                      "unplannable": "pruned", "too_big": "pruned", "naive": "ok"}
    by = {c.schedule.algorithm: c for c in r.candidates}
    assert "not_a_type" in by["broken"].detail or "error" in by["broken"].detail.lower()
    assert "threads per block" in by["too_big"].detail and "does not apply" in by["unplannable"].detail
    assert "NaN" in by["fast_wrong"].detail or "nan" in by["fast_wrong"].detail
    assert r.source == "tuned" and r.schedule.algorithm in ("vectorized", "naive")
    rec = store().user_records()[0]
    assert rec["schedule"]["algorithm"] in ("vectorized", "naive") and rec["check"]["passed"]
    assert rec["candidates"]["wrong"] == 1 and rec["candidates"]["compile_failed"] == 1
    assert rec["space"] == 0                      # the op's schedule-space generation is stamped
    assert all(u["schedule"]["algorithm"] in ("vectorized", "naive") for u in rec["runners_up"])


@pytest.mark.parametrize("fresh_us, kept", [((10.5, 10.0), "vectorized"), ((9.0, 10.0), "naive"), (None, "naive")])
def test_close_winners_are_confirmed_on_fresh_buffers(cpu, isolated, monkeypatch, fresh_us, kept):
    """A winner less than confirm_below faster than the heuristic must win a second, fresh timing;
    a clear winner (None: 2x faster) is not timed again."""
    from jitops.tuning import tuner
    op = _fake_op()
    op.candidates = lambda problem, device: [LR.heuristic(problem, device, "naive")]
    final = {"vectorized": 10.2, "naive": 9.7 if fresh_us else 5.0}
    monkeypatch.setattr(tuner, "_final_us", lambda c: final[c.schedule.algorithm] if c.samples else float("inf"))
    calls = []

    def remeasure(op_, problem, schedules, backend, reps):
        calls.append([s.algorithm for s in schedules])
        return list(fresh_us)
    monkeypatch.setattr(tuner, "remeasure", remeasure)
    problem = op.make_problem({"x": TensorSpec((4096,), "float32")}, {"alpha": 0.1})
    [r] = tune_problems([(op, problem)], cpu, TuneOptions(budget_s=None, workers=1))
    assert calls == ([["naive", "vectorized"]] if fresh_us else [])
    assert r.source == "tuned" and r.schedule.algorithm == kept
    assert r.time_us == final[kept] and r.heuristic_us == 10.2
    assert store().user_records()[0]["schedule"]["algorithm"] == kept


def test_measure_schedules_checks_then_times(cpu):
    """The sweeps' measurement (tuning.sweep): wrong and unplannable schedules get no time and say why."""
    from jitops.tuning.sweep import measure_schedules, remeasure
    op = _fake_op()
    problem = op.make_problem({"x": TensorSpec((8192,), "float32")}, {"alpha": 0.1})
    scheds = [LR.heuristic(problem, cpu.device), LR.heuristic(problem, cpu.device, "naive"),
              Schedule.make("fast_wrong"), Schedule.make("unplannable")]
    good, naive, wrong, unplannable = measure_schedules(op, problem, scheds, cpu, reps=5)
    for m in (good, naive):
        assert m.time_us is not None and m.time_us > 0 and m.max_error is not None and m.max_error <= 1e-6, m
    assert wrong.time_us is None and wrong.max_error is not None and "nan" in wrong.detail.lower()
    assert unplannable.time_us is None and "does not apply" in unplannable.detail
    times = remeasure(op, problem, scheds[1:], cpu, reps=5)
    assert 0 < times[0] < float("inf") and 0 < times[1] < float("inf")   # unchecked: the wrong one is timed too
    assert times[2] == float("inf")


def test_no_record_when_nothing_passes(cpu, isolated):
    op = _fake_op()
    op.candidates = lambda problem, device: [Schedule.make("fast_wrong")]
    op.heuristic = lambda problem, device, algorithm=None: Schedule.make("fast_wrong")
    problem = op.make_problem({"x": TensorSpec((4096,), "float32")}, {"alpha": 0.1})
    [r] = tune_problems([(op, problem)], cpu, TuneOptions(budget_s=None, workers=1))
    assert r.source == "failed" and r.schedule is None and "passed the check" in r.error
    assert store().user_records() == []


# ---------------------------------------------------------------- compile pool

_FAKE_WORKER = r"""
import json, sys, time
for line in sys.stdin:
    job = json.loads(line)
    if "slow" in job["label"]:
        time.sleep(60)
    if "crash" in job["label"]:
        sys.exit(3)
    print(json.dumps({"id": job["id"], "ok": "bad" not in job["label"], "seconds": 0.0, "key": job["id"],
                      "error": "planted error", "resources": {"k": {"registers": 255}}}), flush=True)
"""


def test_pool_times_out_and_survives_crashes(cpu):
    jobs = [CompileJob(f"key{i}", "src", ("k",), label) for i, label in
            enumerate(["ok", "slow", "ok2", "bad", "crash", "ok3"])]
    t0 = time.monotonic()
    with CompilePool(cpu, workers=2, timeout_s=1.5, command=[sys.executable, "-c", _FAKE_WORKER]) as pool:
        out = pool.run(jobs)
    assert time.monotonic() - t0 < 30
    assert {k: o.status for k, o in out.items()} == {"key0": "ok", "key1": "timeout", "key2": "ok", "key3": "failed",
                                                      "key4": "failed", "key5": "ok"}
    assert "timed out" in out["key1"].error and "worker died" in out["key4"].error
    assert out["key0"].resources == {"k": {"registers": 255}}


def test_pool_deadline_skips_the_rest(cpu):
    jobs = [CompileJob(f"key{i}", "src", ("k",), "slow" if i == 0 else "ok") for i in range(4)]
    with CompilePool(cpu, workers=1, timeout_s=60, command=[sys.executable, "-c", _FAKE_WORKER]) as pool:
        out = pool.run(jobs, deadline=time.monotonic() + 1.0)
    assert {o.status for o in out.values()} == {"skipped"} and len(out) == 4


def test_register_report_prunes(cpu):
    """ptxas -v says 255 registers: 255 x 512 threads does not fit a 64K register file."""
    from jitops.device import KNOWN_TARGETS
    from jitops.tuning.compile_pool import CompileOutcome
    from jitops.tuning.worker import parse_ptxas
    log = ("ptxas info    : Compiling entry function 'leaky_relu_vectorized' for 'sm_90'\n"
           "ptxas info    : Function properties for leaky_relu_vectorized\n"
           "    0 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads\n"
           "ptxas info    : Used 255 registers, 372 bytes cmem[0]")
    res = parse_ptxas(log)
    assert res == {"leaky_relu_vectorized": {"registers": 255, "spill_bytes": 8}}
    dev = KNOWN_TARGETS["sm_90"]
    problem = LR.make_problem({"x": TensorSpec((1 << 20,), "float32")}, {"alpha": 0.1})
    c = space.Candidate(Schedule.make("vectorized", vec=4, unroll=1, block=512, waves=0))
    c.plan = LR.plan(problem, c.schedule, dev)
    c.jobs = [CompileJob("k1", "", ("leaky_relu_vectorized",), "x")]
    space.apply_compile_outcomes([c], {"k1": CompileOutcome("k1", "ok", resources=res)}, dev)
    assert c.status == "pruned" and "255 registers x 512 threads" in c.detail


def test_thin_keeps_every_algorithm():
    scheds = [Schedule.make("a", i=i) for i in range(50)] + [Schedule.make("b", i=i) for i in range(3)]
    kept = space.thin(scheds, 10)
    assert len(kept) == 10 and {s.algorithm for s in kept} == {"a", "b"}
    assert Schedule.make("a", i=0) in kept and Schedule.make("a", i=25) in kept


def test_budget_cuts_timing_but_measures_the_heuristic(cpu, isolated, monkeypatch):
    problem = LR.make_problem({"x": TensorSpec((4096,), "float32")}, {"alpha": 0.01})
    opts = TuneOptions(budget_s=None, workers=2, max_candidates=3, save=False)
    tune_problems([(LR, problem)], cpu, opts)           # compile (cached from here on)
    opts = replace(opts, budget_s=1e-3)
    other = LR.make_problem({"x": TensorSpec((8192,), "float32")}, {"alpha": 0.01})
    r, r2 = tune_problems([(LR, problem), (LR, other)], cpu, opts)
    assert r.source == "tuned" and r.schedule == r.heuristic
    assert sorted(c.status for c in r.candidates) == ["ok", "skipped", "skipped"]
    assert r2.source == "skipped" and r2.schedule is None and "budget" in r2.error


def test_a_record_from_another_gpu_of_the_same_key_is_measured_again(cpu, isolated):
    problem = LR.make_problem({"x": TensorSpec((4096,), "float32")}, {"alpha": 0.01})
    rec = records.new_record(cpu.device, "leaky_relu", problem.key(), Schedule.make("naive", block=256), time_us=1.0)
    rec["device_name"] = "some other device with the same arch and multiprocessor count"
    store().put([rec])
    assert engine.select_schedule(LR, problem, cpu.device)[1] == "user"      # calls use it...
    r = jitops.tune(LR, problem, max_candidates=2, workers=1, budget=None)
    assert r.source == "tuned"                                               # ...tuning measures this device


def test_shipped_run_completes_and_merges_the_shipped_file(cpu, isolated, tmp_path, monkeypatch, capsys):
    from jitops.tuning import shipped
    probs = shipped.benchmark_problems(["leaky_relu", "conv2d"])
    names = [n for n, _, _ in probs]
    assert len(probs) == 20 + 21 and "k100_4 float16" in names and "n=4^15 float32" in names
    assert probs[0][2].key() == "leaky_relu:x=4096:float32"

    small = [(n, m, p) for n, m, p in probs if m.NAME == "leaky_relu" and p.numel <= 4 ** 7]
    monkeypatch.setattr(shipped, "benchmark_problems", lambda ops=None: small)
    old = records.new_record(cpu.device, "leaky_relu", "leaky_relu:x=1:float32", Schedule.make("naive", block=64),
                             time_us=1.0)
    records.write_records(config.schedules_dir() / "cpu-w32.json", [old])
    out = tmp_path / "cpu-w32.json"
    assert shipped.main(["--max-candidates", "2", "--no-vendor", "--export", str(out)]) == 0
    written = records.read_records(out)
    assert len(written) == len(small) + 1 and {r["arch"] for r in written} == {"cpu-w32"}
    assert "4 tuned now" in capsys.readouterr().out
    assert shipped.main(["--max-candidates", "2", "--no-vendor"]) == 0       # again: answered from records
    assert "0 tuned now, 4 from records" in capsys.readouterr().out


def test_activations_that_fit_in_l2_are_timed_warm_and_larger_ones_behind_a_flush():
    """An activation's input was just written by the layer before it: the tuner times problems that
    fit in L2 that way (a flush there favoured evict-first schedules that lose in a network)."""
    from jitops.device import DeviceInfo
    from jitops.ops import get_op
    from jitops.ops.base import TensorSpec
    from jitops.tuning.measure import timed_warm
    dev = DeviceInfo("cuda", "sm_90", "test GPU", 32, 132, l2_bytes=60 << 20)
    op = get_op("leaky_relu")
    small = op.make_problem({"x": TensorSpec((4 << 20,), "float32")}, {"alpha": 0.01})     # 32 MB moved
    large = op.make_problem({"x": TensorSpec((16 << 20,), "float32")}, {"alpha": 0.01})    # 128 MB moved
    assert timed_warm(op, small, dev) and not timed_warm(op, large, dev)
    assert not any(s.get("streaming") for s in op.candidates(small, dev))
    assert any(s.get("streaming") for s in op.candidates(large, dev))
    assert not timed_warm(get_op("batch_norm"), None, dev)    # ops without the hook: always flushed
    att = get_op("attention")    # q, k, v and out within 80% of L2, as for conv2d
    spec = lambda s: TensorSpec((1, 16, s, 128), "float16")
    assert timed_warm(att, att.make_problem({"q": spec(2048), "k": spec(2048), "v": spec(2048)}, {}), dev)     # 32 MB
    assert not timed_warm(att, att.make_problem({"q": spec(4096), "k": spec(4096), "v": spec(4096)}, {}), dev)  # 64 MB
    conv = get_op("conv2d")   # input, output and weights within 80% of L2 (48 MB here)
    one = conv.make_problem({"x": TensorSpec((32, 512, 28, 28), "float16", "nhwc"),
                             "w": TensorSpec((128, 512, 1, 1), "float16")}, {})                # 32.3 MB
    wide = conv.make_problem({"x": TensorSpec((32, 256, 56, 56), "float16", "nhwc"),
                              "w": TensorSpec((64, 256, 1, 1), "float16")}, {})                # 64.2 MB
    assert timed_warm(conv, one, dev) and not timed_warm(conv, wide, dev)


def test_channels_last_conv2d_is_checked_in_its_storage_order(cpu):
    """The tuner copies op.random_inputs to device buffers byte for byte and compares outputs with
    op.reference the same way, so both work in storage order: an NHWC conv2d's heuristic schedule
    passes the check (it failed every candidate while conv2d's were NCHW-ordered), and its reference
    is the NCHW one transposed."""
    from jitops.tuning.sweep import measure_schedules
    conv = get_op("conv2d")
    spec = lambda layout: {"x": TensorSpec((2, 16, 9, 7), "float32", layout), "w": TensorSpec((24, 16, 3, 3), "float32"),
                           "bias": TensorSpec((24,), "float32"),
                           "residual": TensorSpec((2, 24, 9, 7), "float32", layout)}
    nchw, nhwc = (conv.make_problem(spec(layout), {"padding": 1, "activation": "relu"}) for layout in ("", "nhwc"))
    m, = measure_schedules(conv, nhwc, [conv.heuristic(nhwc, cpu.device)], cpu, reps=2)
    assert m.time_us is not None and m.max_error <= 1e-6, m.detail
    a, b = conv.random_inputs(nchw, np.random.default_rng(0)), conv.random_inputs(nhwc, np.random.default_rng(0))
    assert b["x"].shape == (2, 9, 7, 16) and np.array_equal(b["x"], a["x"].transpose(0, 2, 3, 1))
    assert np.array_equal(conv.reference(nhwc, b)["y"], conv.reference(nchw, a)["y"].transpose(0, 2, 3, 1))


@pytest.fixture
def benchmark_off():
    """Benchmark mode back to its environment setting after the test (yields jitops.config, its home)."""
    from jitops.tuning import benchmark
    yield config
    config._benchmark[0] = None
    benchmark._told.clear()


def test_benchmark_mode_times_the_shortlist_on_the_first_call(cpu, isolated, benchmark_off):
    """jitops.set_benchmark: the first call of a problem without a record times the op's shortlist
    (the heuristic's pick first), checks each against the pick's output, records the fastest as a
    user record marked as a shortlist, and runs it; the output is right; later calls read the
    record; a tuning run measures the problem again (the record saw a shortlist only)."""
    from jitops.tuning.tuner import from_record
    conv = get_op("conv2d")
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 8, 10, 12)).astype(np.float32)
    w = (rng.standard_normal((16, 8, 3, 3)) / 8).astype(np.float32)
    p = conv.make_problem({"x": TensorSpec(x.shape, "float32"), "w": TensorSpec(w.shape, "float32")}, {"padding": 1})
    shortlist = conv.shortlist(p, cpu.device, 3)
    assert len(shortlist) == 3 and shortlist[0] == conv.heuristic(p, cpu.device) and len(set(shortlist)) == 3
    jitops.set_benchmark(3)
    y = jitops.conv2d(x, w, padding=1)
    ref = conv.reference(p, {"x": x.astype(np.float64), "w": w.astype(np.float64), "bias": None})["y"]
    assert float(np.abs(y - ref).max()) <= 1e-4 * float(np.abs(ref).max())
    rec, = json.loads(isolated[0].read_text())["records"]
    assert rec["shortlist"] == 3 and rec["problem"] == p.key() and rec["check"]["passed"]
    assert rec["check"]["reference"].startswith("the output of ") and Schedule.from_dict(rec["schedule"]) in shortlist
    assert rec["candidates"] == {"ok": 3}
    assert engine.select_schedule(conv, p, cpu.device, backend=cpu) == (Schedule.from_dict(rec["schedule"]), "user")
    assert from_record(conv, p, cpu) is None
    # off again: a new problem takes the heuristic and writes nothing
    jitops.set_benchmark(False)
    q = conv.make_problem({"x": TensorSpec((1, 8, 6, 6), "float32"), "w": TensorSpec((16, 8, 3, 3), "float32")}, {})
    assert engine.select_schedule(conv, q, cpu.device, backend=cpu)[1] == "heuristic"
    assert len(json.loads(isolated[0].read_text())["records"]) == 1


def test_benchmark_mode_times_nothing_during_a_capture(cpu, isolated, benchmark_off, monkeypatch, caplog):
    """While the call's stream (or any stream, through the legacy one) is captured into a CUDA graph,
    a first call keeps the heuristic, records nothing and says why once; a driver that cannot say
    counts as capturing. Ops without a shortlist are left alone. Bad settings name what is expected."""
    conv = get_op("conv2d")
    p = conv.make_problem({"x": TensorSpec((1, 8, 6, 6), "float32"), "w": TensorSpec((16, 8, 3, 3), "float32")}, {})
    jitops.set_benchmark(True)
    monkeypatch.setattr(cpu, "capturing", lambda stream=0: stream == 7)
    with caplog.at_level("WARNING", logger="jitops.tune"):
        for _ in range(2):
            assert engine.select_schedule(conv, p, cpu.device, backend=cpu, stream=7)[1] == "heuristic"
    assert sum("CUDA-graph capture" in r.message for r in caplog.records) == 1
    def broken(stream=0):
        raise RuntimeError("no driver")
    monkeypatch.setattr(cpu, "capturing", broken)
    assert engine.select_schedule(conv, p, cpu.device, backend=cpu)[1] == "heuristic"
    assert not isolated[0].exists()
    lr = LR.make_problem({"x": TensorSpec((4096,), "float32")}, {"alpha": 0.1})
    assert not hasattr(LR, "shortlist") and engine.select_schedule(LR, lr, cpu.device, backend=cpu)[1] == "heuristic"
    with pytest.raises(jitops.ArgumentError, match="number of schedules"):
        jitops.set_benchmark(-3)


def test_benchmark_setting_from_the_environment(benchmark_off, monkeypatch):
    for raw, n in (("", 0), ("0", 0), ("off", 0), ("1", benchmark_off.BENCHMARK_CANDIDATES),
                   ("yes", benchmark_off.BENCHMARK_CANDIDATES), ("4", 4)):
        monkeypatch.setenv(config.ENV_BENCHMARK, raw)
        assert benchmark_off.benchmark_candidates() == n, raw
    jitops.set_benchmark(5)
    assert benchmark_off.benchmark_candidates() == 5      # the call wins over the environment


def test_a_first_call_without_benchmark_mode_leaves_the_tuner_unimported():
    """The benchmark setting is read from jitops.config: with the mode off, a process's first call
    imports nothing of jitops.tuning (importing it there cost ~10 ms of every first call)."""
    import os
    import subprocess
    code = ("import sys, numpy as np, jitops\n"
            "jitops.leaky_relu(np.ones(1024, 'float32'), 0.1)\n"
            "assert not [m for m in sys.modules if m.startswith('jitops.tuning')], sorted(sys.modules)\n")
    env = {k: v for k, v in os.environ.items() if k != config.ENV_BENCHMARK}
    env[config.ENV_BACKEND] = "cpu"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
