"""curvplan workers: claim jobs from PostgreSQL and run each attempt in a child process.

The worker parent (``curvplan_worker.worker``) never imports torch; job kinds that need it are
imported only in the forkserver that starts the attempt children (``curvplan_worker.child``).
"""
