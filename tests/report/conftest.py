"""Fixtures of the report tests: finished jobs built locally (the live service is the shared
``live`` of tests/live_plugin.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "client"))

from plan_bodies import full_measurements, full_targets


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Any:
    """The root fixture's settings with a private data dir (the link key file lives there)."""
    from curvplan_core.config import Settings

    return Settings(
        database_url=database_url,
        auth_disabled=False,
        log_format="console",
        data_dir=tmp_path / "data",
        report_link_seconds=600,
    )


@pytest.fixture(scope="session")
def plan_job() -> dict[str, Any]:
    """A succeeded plan job as the API shows it, with every plan-side section computed."""
    from curvplan_core.planner import Measurements, Targets, make_plan

    measurements, targets = full_measurements(), full_targets()
    rec = make_plan(
        Measurements.model_validate_json(json.dumps(measurements)),
        Targets.model_validate_json(json.dumps(targets)),
        seed=0,
    )
    return {
        "id": "2b1c1f7e-8d34-4d2b-9b43-1f7c1c7f0a11",
        "kind": "plan",
        "status": "succeeded",
        "name": "pilot",
        "tags": {"team": "nlp"},
        "attempt": 1,
        "max_attempts": 3,
        "request": {"kind": "plan", "measurements": measurements, "targets": targets},
        "result": {"recommendation": rec.model_dump(mode="json")},
        "error": None,
        "created_at": "2026-11-30T08:00:00+00:00",
        "started_at": "2026-11-30T08:00:01+00:00",
        "finished_at": "2026-11-30T08:00:02+00:00",
    }


@pytest.fixture(scope="session")
def plan_plots(plan_job: dict[str, Any]) -> list[Any]:
    """The figures of ``plan_job``, drawn once per session (drawing costs seconds)."""
    from curvplan_server.reports.plots import build_plots

    return build_plots(plan_job)


@pytest.fixture(scope="session")
def analyze_job(plan_job: dict[str, Any]) -> dict[str, Any]:
    """An analyze-shaped job: engine blocks with bounds and off-diagonal norms."""
    names = ["layers.0.q", "layers.0.k", "layers.0.v", "layers.1.q"]
    blocks = []
    for i, name in enumerate(names):
        norm = 1.0 + i
        bound = (
            {"value": 4.0 * norm, "applicable": True, "reason": None}
            if i < 3
            else {"value": None, "applicable": False, "reason": "GELU breaks Theorem 1"}
        )
        blocks.append(
            {
                "name": name,
                "spectral_norm": norm,
                "lambda_max": norm,
                "lambda_min": 0.0,
                "bound": bound,
            }
        )
    off = [
        {"row": "layers.0.q", "col": "layers.0.k", "sigma_max": 0.5},
        {"row": "layers.0.k", "col": "layers.0.v", "sigma_max": 2.5},
    ]
    job = {**plan_job, "kind": "analyze", "request": {"kind": "analyze", "model": {}}}
    job["result"] = {
        "measurements": {"blocks": blocks, "off_diagonal": off},
        "planner_inputs": {
            "fields": {"steps_to_target": plan_job["request"]["measurements"]["steps_to_target"]}
        },
        "recommendation": plan_job["result"]["recommendation"],
    }
    return job


@pytest.fixture(scope="session")
def analyze_plots(analyze_job: dict[str, Any]) -> list[Any]:
    """The figures of ``analyze_job``, drawn once per session."""
    from curvplan_server.reports.plots import build_plots

    return build_plots(analyze_job)
