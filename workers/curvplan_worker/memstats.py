"""The memory an attempt process holds on its devices, for the worker's metrics.

Read in the attempt child (the worker parent never initialises CUDA): CUDA allocated,
reserved and peak-allocated bytes per device once this process has initialised CUDA, nothing
otherwise (the parent then reports the child's resident memory, ``metrics.rss_bytes``).
torch is not imported here: a process that never loaded it has no device memory.
"""

from __future__ import annotations

import sys


def device_memory() -> dict[str, dict[str, int]]:
    """``{"cuda:0": {"allocated": …, "reserved": …, "peak": …}, …}`` or ``{}``."""
    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    try:
        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return {}
        return {
            f"cuda:{i}": {
                "allocated": int(torch.cuda.memory_allocated(i)),
                "reserved": int(torch.cuda.memory_reserved(i)),
                "peak": int(torch.cuda.max_memory_allocated(i)),
            }
            for i in range(torch.cuda.device_count())
        }
    except Exception:  # a broken driver must not fail the job's progress report
        return {}
