"""Timing as the project's benchmark rules ask: device events around N back-to-back calls, median of
trials; CUDA-graph replay where the call can be captured; host wall time for per-call latency."""
from __future__ import annotations

import logging
import statistics
import time
from typing import Any, Callable

log = logging.getLogger("jitops.bench")


def warm_on_side_stream(torch: Any, fn: Callable[[], Any]) -> Any:
    """Three calls of fn on a new stream, joined back into the current one (torch asks for this before a
    capture; jitops keeps scratch per stream): the stream."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    return stream


def capture_graph(torch: Any, fn: Callable[[], Any], n: int) -> Any:
    """A CUDA graph of n back-to-back calls of fn, warmed up on a side stream first and replayed once."""
    warm_on_side_stream(torch, fn)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(n):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    return graph


class Timer:
    """Events of torch when a CUDA/ROCm torch is present, host clocks otherwise."""

    def __init__(self, torch: Any = None):
        self.torch = torch if torch is not None and torch.cuda.is_available() else None

    @property
    def on_device(self) -> bool:
        return self.torch is not None

    def sync(self) -> None:
        if self.torch is not None:
            self.torch.cuda.synchronize()

    def per_call_us(self, fn: Callable[[], Any], n: int = 50, trials: int = 5, warmup: int = 3,
                    setup: Callable[[], Any] | None = None) -> float:
        """Median over trials of (time of n back-to-back calls) / n, in microseconds."""
        for _ in range(warmup):
            fn()
        self.sync()
        samples = []
        for _ in range(trials):
            if setup is not None:
                setup()
            if self.torch is not None:
                start = self.torch.cuda.Event(enable_timing=True)
                end = self.torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(n):
                    fn()
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end) * 1e3 / n)
            else:
                t0 = time.perf_counter()
                for _ in range(n):
                    fn()
                samples.append((time.perf_counter() - t0) * 1e6 / n)
        return statistics.median(samples)

    def graph_us(self, fn: Callable[[], Any], n: int = 50, trials: int = 5) -> float | None:
        """Kernel time without launch overhead: capture n calls in a CUDA graph, time replays."""
        if self.torch is None:
            return None
        torch = self.torch
        try:
            graph = capture_graph(torch, fn, n)
            samples = []
            for _ in range(trials):
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                graph.replay()
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end) * 1e3 / n)
            del graph
            return statistics.median(samples)
        except Exception as exc:  # capture is not possible for every call (host copies, syncs)
            log.info("graph capture failed: %s", exc)
            return None

    def latency_us(self, fns: dict[str, Callable[[], Any]], calls: int = 1000) -> dict[str, float]:
        """Host wall time of one synchronized call of each function, median over many calls.

        The functions take turns call by call, so clock changes and background load during the
        measurement fall on all of them alike (timed one after the other, the same function
        differed by 1-3 us from run to run on the H200 machine)."""
        for fn in fns.values():
            for _ in range(5):
                fn()
        self.sync()
        samples: dict[str, list[float]] = {name: [] for name in fns}
        for _ in range(calls):
            for name, fn in fns.items():
                t0 = time.perf_counter()
                fn()
                self.sync()
                samples[name].append((time.perf_counter() - t0) * 1e6)
        return {name: statistics.median(v) for name, v in samples.items()}


    def eager_us(self, fns: dict[str, Callable[[], Any]], calls: int = 2000, trials: int = 5) -> dict[str, float]:
        """Host wall time per call of `calls` back-to-back calls and one synchronize, best of
        `trials`, the functions taking turns trial by trial: what an eager program pays per op
        when the device keeps up (small problems: the host path is the cost)."""
        best = {name: float("inf") for name in fns}
        for fn in fns.values():
            for _ in range(20):
                fn()
        self.sync()
        for _ in range(trials):
            for name, fn in fns.items():
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()
                self.sync()
                best[name] = min(best[name], (time.perf_counter() - t0) * 1e6 / calls)
        return best


def copy_bandwidth_gbs(timer: Timer, nbytes: int = 1 << 30) -> float | None:
    """Device-to-device copy, counting bytes read plus written, in GB/s."""
    if not timer.on_device:
        return None
    torch = timer.torch
    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").uniform_()
    dst = torch.empty_like(src)
    us = timer.per_call_us(lambda: dst.copy_(src), n=20, trials=5)
    return 2 * nbytes / (us * 1e-6) / 1e9
