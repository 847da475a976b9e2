"""Exceptions that job kinds raise and the worker understands."""

from __future__ import annotations

from curvplan_core.jobs.errors import error_dict as error_dict  # the kinds' and the queue's
from curvplan_core.jobs.records import ErrorRecord


class JobError(Exception):
    """A failure the job kind diagnosed itself: the job fails with this error, no retry.

    ``type`` is a short machine-readable slug (e.g. ``invalid-request``), ``title`` a
    human summary that does not change between occurrences, ``detail`` the specifics
    of this occurrence (RFC 9457 vocabulary, as the API reports it).
    """

    def __init__(self, type: str, title: str, detail: str) -> None:
        super().__init__(f"{type}: {title}: {detail}")
        self.type = type
        self.title = title
        self.detail = detail

    def as_dict(self) -> ErrorRecord:
        """The ``job.error`` JSON object."""
        return error_dict(self.type, self.title, self.detail)


class JobCancelled(Exception):
    """Raised by ``JobContext.report_progress`` once the job's cancellation was requested."""


class RetryableError(Exception):
    """A failure that another attempt may not meet (a network transfer, a corrupt download):
    the attempt ends like a crash — the job is queued again with backoff while attempts
    remain — instead of failing the job at once like a :class:`JobError`."""

    #: The job's error type once no attempts are left.
    error_type = "transient-error"
    title = "The job failed on a transient error, on every attempt"
