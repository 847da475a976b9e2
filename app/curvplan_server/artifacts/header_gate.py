"""How many upload headers the API holds and checks at once: a weighted semaphore over bytes.

A safetensors header is held and parsed in the API process (``SafetensorsValidator``) and its
summary kept until the upload is stored: about :data:`HEADER_MEMORY_FACTOR` × the header's
length in memory (measured: a 10 MB header of 100,000 tensors, ~145 MB). Twelve of the
largest at once took 1.74 GB and stalled ``/healthz`` for 8.8 s. Each upload takes its
header's cost from ``CURVPLAN_UPLOAD_HEADER_MEMORY_BYTES`` as soon as the first 8 bytes say
how long the header is, and gives it back when the request ends; an upload that does not fit
is answered 503 with ``Retry-After`` before its header is read.
"""

from __future__ import annotations

import threading

from fastapi import Request

from curvplan_server.problems import Problem

#: Bytes of API memory per byte of safetensors header while it is checked and stored.
HEADER_MEMORY_FACTOR = 15
#: What a 503 for a full gate tells the client to wait, in seconds.
RETRY_AFTER_SECONDS = 2


class HeaderGateFull(Exception):
    """No room for this header's check now."""


class HeaderMemoryGate:
    """A non-blocking weighted semaphore: :meth:`take` a header's cost or raise
    :class:`HeaderGateFull`; :meth:`give` it back. Thread-safe (uploads feed it from the
    threadpool). One header is always admitted when nothing is held, however large."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._held = 0
        self._lock = threading.Lock()

    @staticmethod
    def cost(header_bytes: int) -> int:
        return HEADER_MEMORY_FACTOR * header_bytes

    @property
    def held(self) -> int:
        return self._held

    def take(self, header_bytes: int) -> int:
        cost = self.cost(header_bytes)
        with self._lock:
            if self._held and self._held + cost > self.budget_bytes:
                raise HeaderGateFull()
            self._held += cost
        return cost

    def give(self, cost: int) -> None:
        with self._lock:
            self._held -= cost


def header_gate(request: Request) -> HeaderMemoryGate:
    """The API process's gate (created on first use, from the settings)."""
    gate = getattr(request.app.state, "header_gate", None)
    if gate is None:
        gate = HeaderMemoryGate(request.app.state.settings.upload_header_memory_bytes)
        request.app.state.header_gate = gate
    return gate


def gate_full_problem() -> Problem:
    """503 with ``Retry-After``: the uploads being checked hold the header memory budget."""
    return Problem(
        503,
        "the service is checking as many upload headers as its memory budget allows "
        "(CURVPLAN_UPLOAD_HEADER_MEMORY_BYTES); nothing was stored: send the file again after "
        "the delay in Retry-After",
        title="Service Unavailable",
        type="https://curvplan.dev/problems/uploads-busy",
        headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
    )
