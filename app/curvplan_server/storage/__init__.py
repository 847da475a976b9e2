"""Storage that cleans up after itself: blob locking and garbage collection, temp-file sweeps,
per-project quotas, artifact deletion and the retention of finished jobs."""
