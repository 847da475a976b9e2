"""A reference spec's size is bounded like a Hugging Face config's: the parameter count the
spec implies is checked against CURVPLAN_MAX_MODEL_PARAMETERS before the job is queued.

``{"d_model": 1000000000, …}`` was accepted (202); the worker then tried to allocate 64 GB.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import text
from test_analyze_api import SPEC, _body, _upload

from curvplan.types.spec import ModelSpec

SPECS = [
    SPEC,
    {**SPEC, "task": {"type": "causal_lm", "vocab_size": 11, "seq_len": 6, "tie_embeddings": True}},
    {**SPEC, "bias": False, "norm": "rmsnorm", "norm_position": "pre", "attn_output_proj": False},
    {**SPEC, "norm_affine": False, "positional": "sinusoidal", "n_layers": 3},
    {**SPEC, "task": {"type": "classification", "seq_len": 5, "vocab_size": 9, "n_classes": 3}},
    {**SPEC, "task": {"type": "classification", "seq_len": 5, "input_dim": 7, "n_classes": 3}},
    {**SPEC, "task": {"type": "regression", "seq_len": 4, "input_dim": 3, "output_dim": 2}},
    {**SPEC, "positional": "none", "task": {"type": "regression", "seq_len": 4}},
]


@pytest.mark.parametrize("spec", SPECS)
def test_parameter_count_is_what_the_engine_builds(spec: dict[str, Any]) -> None:
    from curvplan_worker.curvature.model import build_model

    model = build_model(spec)
    built = sum(p.numel() for p in model.parameters())  # a tied tensor appears once
    assert ModelSpec.model_validate(spec).parameter_count() == built


def test_a_spec_above_the_parameter_limit_is_refused_before_queueing(
    client: Any, auth_headers: dict[str, str], db_session: Any
) -> None:
    ckpt = _upload(client, auth_headers, "checkpoint")
    data = _upload(client, auth_headers, "dataset")
    before = db_session.execute(text("SELECT count(*) FROM job")).scalar_one()
    huge = {**SPEC, "d_model": 1_000_000_000, "n_heads": 1}
    response = client.post("/v1/jobs", json=_body(ckpt, data, model=huge), headers=auth_headers)
    assert response.status_code == 422, response.text
    [error] = response.json()["errors"]
    assert error["field"] == "body.model" and error["type"] == "model_too_large"
    count = ModelSpec.model_validate(huge).parameter_count()
    assert f"{count:,}" in error["message"] and "CURVPLAN_MAX_MODEL_PARAMETERS" in error["message"]
    assert db_session.execute(text("SELECT count(*) FROM job")).scalar_one() == before
    fine = client.post("/v1/jobs", json=_body(ckpt, data), headers=auth_headers)
    assert fine.status_code == 202, fine.text


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (
            {"task": {**SPEC["task"], "tie_embeddings": 0}},
            "body.model.task.causal_lm.tie_embeddings",
        ),
        ({"bias": 1}, "body.model.bias"),
        ({"norm_affine": "true"}, "body.model.norm_affine"),
    ],
)
def test_spec_booleans_are_strict(
    client: Any, auth_headers: dict[str, str], change: dict[str, Any], field: str
) -> None:
    """``"tie_embeddings": 0`` was read as false; a boolean field takes true or false only."""
    body = _body(str(uuid.uuid4()), str(uuid.uuid4()), model={**SPEC, **change})
    response = client.post("/v1/jobs", json=body, headers=auth_headers)
    assert response.status_code == 422, response.text
    fields = [e["field"] for e in response.json()["errors"]]
    assert field in fields, fields
