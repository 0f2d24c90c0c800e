"""Bad input gets a clear error naming the argument."""
from __future__ import annotations

import numpy as np
import pytest

import jitops
from jitops.errors import ArgumentError, ScheduleError


def test_unsupported_dtype():
    with pytest.raises(ArgumentError, match=r"argument 'x'.*float32, float16.*int32"):
        jitops.leaky_relu(np.arange(10, dtype=np.int32))


def test_non_contiguous():
    x = np.random.randn(10, 10).astype(np.float32)[:, ::2]
    with pytest.raises(ArgumentError, match=r"argument 'x'.*contiguous"):
        jitops.leaky_relu(x)


def test_python_list():
    with pytest.raises(ArgumentError, match=r"argument 'x'.*an array.*list"):
        jitops.leaky_relu([1.0, 2.0])


def test_bad_alpha():
    x = np.ones(4, np.float32)
    with pytest.raises(ArgumentError, match=r"argument 'alpha'"):
        jitops.leaky_relu(x, alpha="big")
    with pytest.raises(ArgumentError, match=r"argument 'alpha'.*finite"):
        jitops.leaky_relu(x, alpha=float("nan"))


def test_out_mismatch():
    x = np.ones(4, np.float32)
    with pytest.raises(ArgumentError, match=r"argument 'out'.*shape \(4,\)"):
        jitops.leaky_relu(x, out=np.empty(5, np.float32))
    with pytest.raises(ArgumentError, match=r"argument 'out'.*float32"):
        jitops.leaky_relu(x, out=np.empty(4, np.float16))


def test_mixed_kinds():
    torch = pytest.importorskip("torch")
    x = np.ones(4, np.float32)
    with pytest.raises(ArgumentError, match=r"argument 'out'"):
        jitops.leaky_relu(x, out=torch.empty(4).to(torch.float16))


def test_unknown_algorithm():
    with pytest.raises(ScheduleError, match=r"no algorithm 'winograd'"):
        jitops.leaky_relu(np.ones(4, np.float32), schedule="winograd")


def test_offline_backend_refuses_to_launch():
    from jitops.errors import DeviceRequired
    be = jitops.get_backend(target="sm_90")
    with pytest.raises(DeviceRequired, match=r"compile-only"):
        with jitops.use_backend(be):
            jitops.leaky_relu(np.ones(4, np.float32))


def test_unknown_backend_and_target():
    from jitops.errors import BackendUnavailable
    with pytest.raises(BackendUnavailable, match=r"unknown backend 'opencl'"):
        jitops.get_backend("opencl")
    with pytest.raises(BackendUnavailable, match=r"unknown target 'sm_xx'"):
        jitops.get_backend("cuda", target="sm_xx")
