"""The agent endpoints (``/v1/agents``) over a :class:`~curvplan.client.sync.Client`: what
``curvplan agent`` calls. Errors are the client's (a lost lease is a ``ConflictError``)."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from curvplan.client import _common as c
from curvplan.client.sync import Client
from curvplan.types.agents import (
    AgentClaimOut,
    AgentEnd,
    AgentHeartbeatOut,
    AgentJob,
    AgentOut,
    AgentProgress,
    LossRecord,
)
from curvplan.types.json_types import ReadJson


class AgentAPI:
    """One registered agent: its id, and the calls of its claimed attempts."""

    def __init__(self, client: Client, lease_seconds: float | None = None) -> None:
        self.client = client
        self.lease_seconds = lease_seconds
        answer = self._post(
            "/v1/agents", {"hostname": socket.gethostname(), "pid": os.getpid()}, idempotent=False
        )
        self.agent = AgentOut.model_validate(answer)

    @property
    def heartbeat_seconds(self) -> float:
        lease = self.lease_seconds or self.agent.lease_seconds
        return lease / 3.0

    def _post(self, path: str, body: Mapping[str, ReadJson], *, idempotent: bool = True) -> Any:
        """Every write after a claim is fenced on the attempt, so resending one that may have
        arrived is safe (a duplicate is answered 409 and writes nothing); a claim is not."""
        return self.client._send(c.Call("POST", path, json=body, idempotent=idempotent))

    def _job_path(self, job: AgentJob, action: str) -> str:
        return f"/v1/agents/{self.agent.id}/jobs/{uuid.UUID(str(job.job_id))}/{action}"

    def claim(self) -> AgentJob | None:
        answer = self._post(
            f"/v1/agents/{self.agent.id}/claim",
            {"lease_seconds": self.lease_seconds},
            idempotent=False,
        )
        return AgentClaimOut.model_validate(answer).job

    def heartbeat(self, job: AgentJob, progress: AgentProgress | None) -> AgentHeartbeatOut:
        sent = None if progress is None else progress.model_dump(mode="json", exclude_unset=True)
        body = {"attempt": job.attempt, "progress": sent, "lease_seconds": self.lease_seconds}
        return AgentHeartbeatOut.model_validate(self._post(self._job_path(job, "heartbeat"), body))

    def complete(self, job: AgentJob, records: Sequence[LossRecord], seconds: float) -> AgentEnd:
        body: dict[str, ReadJson] = {
            "attempt": job.attempt,
            "records": [r.model_dump(exclude_none=True) for r in records],
            "seconds": seconds,
        }
        return AgentEnd.model_validate(self._post(self._job_path(job, "complete"), body))

    def fail(
        self, job: AgentJob, error_type: str, title: str, detail: str, *, retry: bool = False
    ) -> AgentEnd:
        body: dict[str, ReadJson] = {
            "attempt": job.attempt,
            "error": {"type": error_type, "title": title, "detail": detail[-8000:]},
            "retry": retry,
        }
        return AgentEnd.model_validate(self._post(self._job_path(job, "fail"), body))

    def cancelled(self, job: AgentJob) -> AgentEnd:
        answer = self._post(self._job_path(job, "cancelled"), {"attempt": job.attempt})
        return AgentEnd.model_validate(answer)

    def release(self, job: AgentJob) -> AgentEnd:
        answer = self._post(self._job_path(job, "release"), {"attempt": job.attempt})
        return AgentEnd.model_validate(answer)

    def stop(self) -> None:
        self.client._send(c.Call("DELETE", f"/v1/agents/{self.agent.id}", expect="text"))
