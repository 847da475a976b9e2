"""The exit codes an attempt's child ends with on purpose (``attempt.describe_exit`` reads them).

Below the child and the data-parallel ranks alike.
"""

from __future__ import annotations

#: The child saw its worker parent go away (the lifeline closed) and stopped.
EXIT_WORKER_GONE = 75
#: A data-parallel rank of the attempt died (``curvplan_worker.analyze.ranks``): a crash.
EXIT_RANK_DIED = 76
