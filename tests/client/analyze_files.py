"""A tiny Transformer's checkpoint and data, written with the curvature engine's own writers,
and analysis options small enough for a shared 2-core machine (same sizes as tests/analyze)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SPEC: dict[str, Any] = {
    "d_model": 8,
    "n_heads": 2,
    "d_ff": 16,
    "n_layers": 1,
    "task": {"type": "causal_lm", "vocab_size": 11, "seq_len": 6},
}
OPTIONS: dict[str, Any] = {
    "precision": "float64",
    "seed": 3,
    "dense": "off",
    "max_iter": 60,
    "trace_probes": 6,
    "off_diagonal": [["layers.0.q", "layers.0.k"], ["layers.0.k", "layers.0.v"]],
    "hessian_subsample": 2,
    "per_sample_max_iter": 30,
    "n_directions": 2,
    "perturbation_radius": 0.05,
    "gradient_noise": False,
}
TARGETS: dict[str, Any] = {"tolerances": [0.05], "radius": 0.05, "orderings": 8, "bootstrap": 20}
N_EXAMPLES = 12


def write_analyze_files(out: Path, n_examples: int = N_EXAMPLES) -> dict[str, Path]:
    """spec.json, checkpoint.safetensors, data.safetensors (``n_examples`` sequences) and a
    mismatched wider checkpoint."""
    import torch

    from curvplan_worker.curvature.checkpoint import save_checkpoint
    from curvplan_worker.curvature.data import Dataset, save_dataset
    from curvplan_worker.curvature.model import build_model

    out.mkdir(parents=True, exist_ok=True)
    (out / "spec.json").write_text(json.dumps(SPEC))
    (out / "targets.json").write_text(json.dumps(TARGETS))
    save_checkpoint(build_model(SPEC, seed=1), out / "checkpoint.safetensors")
    save_checkpoint(build_model({**SPEC, "d_model": 12}, seed=1), out / "wider.safetensors")
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 11, (n_examples, 7), generator=gen)
    save_dataset(Dataset(tokens[:, :-1], tokens[:, 1:]), out / "data.safetensors")
    return {p.stem: p for p in out.iterdir()}


def option_flags() -> list[str]:
    """OPTIONS as repeated ``--option KEY=VALUE`` flags (values JSON-encoded)."""
    flags: list[str] = []
    for key, value in OPTIONS.items():
        flags += ["--option", f"{key}={json.dumps(value)}"]
    return flags
