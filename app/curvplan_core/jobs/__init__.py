"""A job's status after its submission: the queue's SQL (claim, heartbeat, fenced writes,
reaper, fan-out; :mod:`~curvplan_core.jobs.store`) and a waiting parent's fan-in
(:mod:`~curvplan_core.jobs.fanout`)."""
