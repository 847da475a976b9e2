"""What a slot's supervisor and its heartbeat thread share: the attempt that runs now."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime

from curvplan_core.jobs import store
from curvplan_core.jobs.records import ProgressRecord, StageRecord
from curvplan_worker.attempt import Progress

#: Stage changes kept in a job's progress history (a model with hundreds of blocks stops
#: recording there; the latest progress is always written).
MAX_STAGE_HISTORY = 200


@dataclass
class CurrentAttempt:
    """The attempt a slot runs now, shared by its supervisor and its heartbeat thread."""

    fence: store.Fence
    progress: Progress | None = None
    progress_written: Progress | None = None
    #: One ``{"stage", "started_at"}`` per stage change, so a client that polls less often
    #: than stages change still sees every stage the attempt went through, with its timing.
    stages: list[StageRecord] = field(default_factory=list)
    #: Set by the heartbeat: the job's cancellation was requested / its lease was lost.
    cancel_requested: bool = False
    lease_lost: bool = False

    def record(self, progress: Progress) -> None:
        """Keep ``progress`` as the latest; note a new stage in the history (capped)."""
        self.progress = progress
        last = self.stages[-1]["stage"] if self.stages else None
        if progress.stage != last and len(self.stages) < MAX_STAGE_HISTORY:
            started = datetime.now(UTC).isoformat()
            self.stages.append({"stage": progress.stage, "started_at": started})

    def progress_payload(self, progress: Progress | None) -> ProgressRecord | None:
        """What the job row's ``progress`` holds: the latest report and the stage history."""
        if progress is None:
            return None
        return {**progress.as_dict(), "stages": list(self.stages)}


@dataclass
class SlotState:
    """The slot's current attempt (under ``lock``) and the event that makes it beat now."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    current: CurrentAttempt | None = None
    beat_now: threading.Event = field(default_factory=threading.Event)
