"""curvplan workers: claim jobs from PostgreSQL and run each attempt in a child process.

The worker parent (``workers.worker``) never imports torch; job kinds that need it are
imported only in the forkserver that starts the attempt children (``workers.child``).
"""
