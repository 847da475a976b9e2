"""Helpers of the sweep tests: a tiny learnable language and an API key."""

from __future__ import annotations

import uuid
from typing import Any

TINY_SPEC: dict[str, Any] = {
    "d_model": 8,
    "n_heads": 2,
    "d_ff": 16,
    "n_layers": 1,
    "task": {"type": "causal_lm", "vocab_size": 11, "seq_len": 6},
}


def counting_data(n: int, seed: int) -> Any:
    """Sequences that count mod 11 from a random start: learnable in tens of steps."""
    import torch

    from curvplan_worker.curvature.data import Dataset

    gen = torch.Generator().manual_seed(seed)
    start = torch.randint(0, 11, (n, 1), generator=gen)
    tokens = (start + torch.arange(7)) % 11
    return Dataset(tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())


def api_key(database_url: str) -> str:
    from curvplan_core.credentials.keys import create_key
    from curvplan_core.db import make_engine, make_sessionmaker

    engine = make_engine(database_url)
    try:
        with make_sessionmaker(engine)() as session:
            key = create_key(session, f"sweep-{uuid.uuid4().hex[:6]}")
            session.commit()
    finally:
        engine.dispose()
    return key
