"""A worker's device-memory metrics: what an attempt reports through its pipe (CUDA per
device) and, for an attempt without CUDA, its resident memory read from /proc."""

from __future__ import annotations

import multiprocessing
import os
import re

from curvplan_worker.attempt import AttemptProcess, MemoryReport, Progress
from curvplan_worker.metrics import WorkerMetrics, rss_bytes

CUDA = {
    "cuda:0": {"allocated": 3 * 2**30, "reserved": 4 * 2**30, "peak": 5 * 2**30},
    "cuda:1": {"allocated": 1, "reserved": 2, "peak": 3},
}


def _gauges(text: str) -> dict[tuple[str, str], float]:
    pattern = r'curvplan_worker_device_memory_bytes\{device="([^"]+)",stat="([^"]+)"\} (\S+)'
    return {(d, s): float(v) for d, s, v in re.findall(pattern, text)}


def test_cuda_reports_are_exported_per_device_and_rss_stands_in_without_cuda():
    metrics = WorkerMetrics()
    metrics.attempt_started("w1", "job-1", os.getpid())
    gauges = _gauges(metrics.render().decode())
    assert set(gauges) == {("cpu", "rss")}
    own = rss_bytes(os.getpid())
    assert own is not None and 0.5 * own < gauges[("cpu", "rss")] < 2 * own

    metrics.device_memory_report("w1", CUDA)
    gauges = _gauges(metrics.render().decode())
    assert gauges == {(d, s): float(v) for d, stats in CUDA.items() for s, v in stats.items()}

    metrics.attempt_ended("w1", "analyze", "succeeded", 1.0)
    assert _gauges(metrics.render().decode()) == {}


def test_the_attempt_pipe_carries_memory_reports_next_to_progress():
    reader, writer = multiprocessing.Pipe(duplex=False)
    attempt = object.__new__(AttemptProcess)  # only its receiving end, no process
    attempt._results, attempt._eof = reader, False
    writer.send(("progress", 0.5, "block spectra 1/2", "block q"))
    writer.send(("memory", CUDA))
    assert attempt.receive(5) == [
        Progress(0.5, "block spectra 1/2", "block q"),
        MemoryReport(CUDA),
    ]
