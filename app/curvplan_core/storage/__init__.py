"""Storage that cleans up after itself: blob locking and garbage collection, temp-file sweeps and
the retention of finished jobs (the API's quotas and artifact deletion are the server's)."""
