"""curvplan_core: what the API (``curvplan_server``) and the workers (``curvplan_worker``) share.

Nothing here speaks HTTP or imports FastAPI or torch (docs/layout.md): settings
(:mod:`~curvplan_core.config`), the database engine and sessions (:mod:`~curvplan_core.db`),
logging, the queue notifier, credentials (key hashing, creation and lookup), the blob store and
the checks of what a file holds, storage garbage collection and retention, a job's status
changes after submission (the queue's SQL and the fan-out) and the planner (numpy/scipy).
"""
