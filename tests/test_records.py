"""Tuning records: storage, lookup order, arch and device isolation, merge, export, clear, stale records."""
from __future__ import annotations

import json
import logging
from dataclasses import replace

import pytest

from jitops import engine, records
from jitops.cli import main
from jitops.device import KNOWN_TARGETS
from jitops.ops import get_op
from jitops.ops.base import Schedule, TensorSpec
from jitops.records import new_record, read_records, record_arch, store, write_records

H200 = replace(KNOWN_TARGETS["sm_90"], multiprocessors=132, online=True)
H100_PCIE = replace(H200, multiprocessors=114)
A100 = replace(KNOWN_TARGETS["sm_80"], online=True)
LR = get_op("leaky_relu")
PROBLEM = LR.make_problem({"x": TensorSpec((1 << 20,), "float32")}, {"alpha": 0.01})
KEY = PROBLEM.key()
FAST = Schedule.make("vectorized", vec=4, unroll=2, block=128, waves=8, streaming=False)
OTHER = Schedule.make("vectorized", vec=2, unroll=1, block=512, waves=0, streaming=True)


pytestmark = pytest.mark.usefixtures("isolated")   # conftest: private records for every test


def rec(device, schedule=FAST, time_us=10.0, problem=KEY, op="leaky_relu"):
    return new_record(device, op, problem, schedule, time_us=time_us)


def test_put_then_lookup_exact_device(isolated):
    store().put([rec(H200)])
    assert store().lookup(H200, "leaky_relu", KEY) == (FAST, "user")
    data = json.loads(isolated[0].read_text())
    r = data["records"][0]
    assert data["format"] == records.FORMAT and r["device"] == "sm_90-132sm" and r["jitops"]
    # A user record is for that device only: another sm_90 with fewer multiprocessors does not use it.
    assert store().lookup(H100_PCIE, "leaky_relu", KEY) is None
    # Another problem or op: no record.
    assert store().lookup(H200, "leaky_relu", KEY.replace("1048576", "4096")) is None
    assert store().lookup(H200, "conv2d", KEY) is None


def test_records_of_another_arch_are_never_applied(isolated):
    user, shipped = isolated
    store().put([rec(A100)])
    assert store().lookup(H200, "leaky_relu", KEY) is None
    assert store().lookup(A100, "leaky_relu", KEY) == (FAST, "user")
    # A foreign record inside schedules/sm_90.json (hand-edited, mis-exported) is not applied either.
    foreign = rec(A100, OTHER)
    write_records(shipped / "sm_90.json", [foreign])
    store().invalidate()
    assert store().lookup(H200, "leaky_relu", KEY) is None
    assert store().shipped_records("sm_90") == []


def test_lookup_order_user_then_bundle_then_shipped(isolated):
    user, shipped = isolated
    write_records(shipped / "sm_90.json", [rec(H100_PCIE, OTHER)])
    # Shipped records apply across the arch (any multiprocessor count).
    assert store().lookup(H200, "leaky_relu", KEY) == (OTHER, "shipped")
    bundle_sched = Schedule.make("naive", block=256)
    store().extra.append(rec(H200, bundle_sched))
    try:
        assert store().lookup(H200, "leaky_relu", KEY) == (bundle_sched, "bundle")
        store().put([rec(H200)])
        assert store().lookup(H200, "leaky_relu", KEY) == (FAST, "user")
    finally:
        store().extra.clear()


def test_shipped_prefers_the_same_multiprocessor_count(isolated):
    user, shipped = isolated
    write_records(shipped / "sm_90.json", [rec(H100_PCIE, OTHER), rec(H200, FAST)])
    assert store().lookup(H200, "leaky_relu", KEY) == (FAST, "shipped")
    assert store().lookup(H100_PCIE, "leaky_relu", KEY) == (OTHER, "shipped")


def test_emulator_warp_size_is_part_of_the_arch():
    from jitops.runtime import get_backend
    w32 = get_backend("cpu", warp_size=32).device
    w64 = get_backend("cpu", warp_size=64).device
    assert record_arch(w32) == "cpu-w32" and record_arch(w64) == "cpu-w64"
    store().put([rec(w32)])
    assert store().lookup(w32, "leaky_relu", KEY) == (FAST, "user")
    assert store().lookup(w64, "leaky_relu", KEY) is None


def test_put_replaces_same_device_and_keeps_others(isolated):
    store().put([rec(H200, time_us=10.0), rec(A100)])
    store().put([rec(H200, OTHER, time_us=12.0)])
    rs = store().user_records()
    assert len(rs) == 2
    assert store().lookup(H200, "leaky_relu", KEY) == (OTHER, "user")   # newest measurement wins on put


def test_merge_policies(tmp_path, isolated):
    store().put([rec(H200, FAST, time_us=10.0)])
    theirs = tmp_path / "theirs.json"
    write_records(theirs, [rec(H200, OTHER, time_us=20.0), rec(A100, OTHER, time_us=5.0)])
    report = store().merge([theirs])             # default: the faster measurement stays
    assert (report.added, report.replaced, report.kept) == (1, 0, 1)
    assert store().lookup(H200, "leaky_relu", KEY)[0] == FAST
    report = store().merge([theirs], prefer="incoming")
    assert report.replaced == 2 and store().lookup(H200, "leaky_relu", KEY)[0] == OTHER
    write_records(theirs, [rec(H200, FAST, time_us=1.0)])
    report = store().merge([theirs], prefer="existing")
    assert report.kept == 1 and store().lookup(H200, "leaky_relu", KEY)[0] == OTHER
    faster = tmp_path / "faster.json"
    write_records(faster, [rec(H200, FAST, time_us=1.0)])
    assert store().merge([faster]).replaced == 1 and store().lookup(H200, "leaky_relu", KEY)[0] == FAST


def test_merge_rejects_other_formats_and_counts_invalid_records(tmp_path, isolated):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"records": []}))
    with pytest.raises(ValueError, match="not a jitops tuning-record file"):
        store().merge([bad])
    mixed = tmp_path / "mixed.json"
    mixed.write_text(json.dumps({"format": 1, "records": [rec(H200), {"arch": "sm_90"}, {"op": 1}]}))
    report = store().merge([mixed])
    assert report.added == 1 and report.invalid == 2


def test_unreadable_user_file_is_ignored_with_a_warning(isolated, caplog):
    user, _ = isolated
    user.parent.mkdir(parents=True)
    user.write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="jitops.records"):
        assert store().lookup(H200, "leaky_relu", KEY) is None
    assert "unreadable" in caplog.text
    store().put([rec(H200)])                     # and writing replaces it with a good file
    assert read_records(user)[0]["schedule"] == FAST.as_dict()


def test_stale_record_falls_back_to_the_heuristic(isolated, caplog):
    """A record whose schedule the op no longer plans (another jitops version) must not break calls."""
    dev = H200
    stale = Schedule.make("vectorized", vec=3, unroll=1, block=256, waves=0)   # 12-byte vectors: refused
    store().put([rec(dev, stale)])
    with caplog.at_level(logging.WARNING, logger="jitops.engine"):
        sched, origin = engine.select_schedule(LR, PROBLEM, dev)
    assert origin == "heuristic" and sched == LR.heuristic(PROBLEM, dev)
    assert "ignoring user record" in caplog.text


def test_records_of_another_schedule_space_are_skipped(isolated, monkeypatch, caplog):
    """A record tuned before the op gained a kernel family (an older SPACE) is skipped: the next
    source that is current, else the heuristic, decides; the tuner stamps the op's generation."""
    user, shipped = isolated
    write_records(shipped / "sm_90.json", [rec(H200, OTHER)])                   # no stamp: generation 0
    store().invalidate()
    assert engine.select_schedule(LR, PROBLEM, H200) == (OTHER, "shipped")
    monkeypatch.setattr(LR, "SPACE", 1, raising=False)
    with caplog.at_level(logging.INFO, logger="jitops.records"):
        sched, origin = engine.select_schedule(LR, PROBLEM, H200)
    assert origin == "heuristic" and sched == LR.heuristic(PROBLEM, H200)
    assert "schedule space 0, now 1" in caplog.text
    current = {**rec(H200, FAST), "space": 1}
    store().put([{**rec(H200, Schedule.make("naive", block=256)), "space": 0}])     # stale user record
    write_records(shipped / "sm_90.json", [current])
    store().invalidate()
    assert engine.select_schedule(LR, PROBLEM, H200) == (FAST, "shipped")        # past the stale user one
    assert records.op_space(get_op("attention")) >= 1                           # fused_wgmma with TMA


def test_cli_list_export_merge_clear(tmp_path, isolated, capsys):
    _, shipped = isolated
    store().put([rec(H200), rec(A100, OTHER), rec(H200, OTHER, problem=KEY.replace("1048576", "4096"))])
    write_records(shipped / "sm_90.json", [rec(H200, OTHER, time_us=11.0)])
    assert main(["records", "list"]) == 0
    out = capsys.readouterr().out
    assert out.count("user ") == 3 and out.count("shipped ") == 1 and "sm_90-132sm" in out

    path = tmp_path / "export.json"
    assert main(["records", "export", str(path), "--arch", "sm_90"]) == 0
    exported = read_records(path)
    assert len(exported) == 2 and {r["arch"] for r in exported} == {"sm_90"}

    assert main(["records", "clear", "--arch", "sm_80"]) == 0
    assert "removed 1 records" in capsys.readouterr().out
    assert len(store().user_records()) == 2
    assert main(["records", "clear"]) == 0
    assert store().user_records() == []

    assert main(["records", "merge", str(path)]) == 0
    assert "2 added" in capsys.readouterr().out
    assert store().lookup(H200, "leaky_relu", KEY) == (FAST, "user")
    assert main(["records", "merge", str(tmp_path / "missing.json")]) == 2
