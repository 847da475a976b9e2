"""The API's side of storage: per-project quotas, artifact deletion, the temp-file sweeper and
the process's blob store (blob locking, GC and retention are the core's, curvplan_core.storage)."""
