"""Hardening at the API: bodies the worker would refuse (or PostgreSQL could not
store) are 422s naming the field, nothing is queued, and a 422 never echoes a huge input."""

from __future__ import annotations

import json
import uuid
from typing import Any

import numpy as np
import pytest
from api_helpers import assert_problem, error_fields
from safetensors.numpy import save as st_save
from sqlalchemy import text

SPEC = {
    "d_model": 8,
    "n_heads": 2,
    "d_ff": 16,
    "n_layers": 1,
    "task": {"type": "causal_lm", "vocab_size": 11, "seq_len": 6},
}


def _upload(client: Any, headers: dict[str, str], kind: str) -> str:
    rng = np.random.default_rng(0)
    if kind == "checkpoint":
        tensors = {"embed.weight": rng.standard_normal((11, 8)).astype(np.float32)}
    else:
        tokens = rng.integers(0, 11, size=(64, 6)).astype(np.int64)
        tensors = {"inputs": tokens, "targets": tokens}
    response = client.post(
        "/v1/artifacts",
        headers=headers,
        files={"file": ("f.safetensors", st_save(tensors), "application/octet-stream")},
        data={"kind": kind},
    )
    assert response.status_code in (200, 201), response.text
    return response.json()["id"]


def _jobs(db_session: Any) -> int:
    return db_session.execute(text("SELECT count(*) FROM job")).scalar_one()


def _post_raw(client: Any, headers: dict[str, str], raw: str) -> Any:
    return client.post(
        "/v1/jobs", headers={**headers, "Content-Type": "application/json"}, content=raw
    )


# --------------------------------------------------------------------------- finding 4
@pytest.mark.parametrize("number", ["1e999", "Infinity", "-Infinity", "NaN", "-1e400"])
def test_a_non_finite_option_of_an_analyze_is_a_422_naming_it(
    client: Any, auth_headers: dict[str, str], db_session: Any, number: str
) -> None:
    """``"perturbation_radius": 1e999`` passed ``gt=0`` as inf; PostgreSQL refused to store
    the request and the answer was a 500."""
    checkpoint = _upload(client, auth_headers, "checkpoint")
    dataset = _upload(client, auth_headers, "dataset")
    before = _jobs(db_session)
    raw = (
        f'{{"kind": "analyze", "model": {json.dumps(SPEC)}, "checkpoint": "{checkpoint}", '
        f'"dataset": "{dataset}", "options": {{"perturbation_radius": {number}}}}}'
    )
    problem = assert_problem(_post_raw(client, auth_headers, raw), 422)
    assert error_fields(problem) == {"body.options.perturbation_radius"}
    assert problem["errors"][0]["type"] == "finite_number"
    assert _jobs(db_session) == before


def test_every_non_finite_number_of_any_body_is_named(
    client: Any, auth_headers: dict[str, str]
) -> None:
    """One rule for every body and every depth: each such number is its own field error."""
    raw = (
        '{"kind": "plan", "measurements": {"per_sample_losses": [0.5, NaN, 1e999], '
        '"loss_bound": 2.0}, "targets": {"radius": -Infinity}}'
    )
    problem = assert_problem(_post_raw(client, auth_headers, raw), 422)
    assert error_fields(problem) == {
        "body.measurements.per_sample_losses.1",
        "body.measurements.per_sample_losses.2",
        "body.targets.radius",
    }
    register = client.post(
        "/v1/artifacts",
        headers={**auth_headers, "Content-Type": "application/json"},
        content='{"kind": "checkpoint", "uri": "file:///x.safetensors", "name": "a", "z": NaN}',
    )
    assert error_fields(assert_problem(register, 422)) == {"body.z"}


def test_finite_extremes_and_the_tokens_in_texts_still_pass(
    client: Any, auth_headers: dict[str, str], plan_body: dict[str, Any]
) -> None:
    """1e-300 and a text that spells NaN or Infinity are no non-finite numbers."""
    plan_body["name"] = "NaN Infinity 1e999"
    plan_body["targets"]["tolerances"] = [1e-3, 0.5e-2]
    plan_body["measurements"]["per_sample_losses"][0] = 1e-300
    response = client.post("/v1/jobs", json=plan_body, headers=auth_headers)
    assert response.status_code == 202, response.text


# --------------------------------------------------------------------------- finding 7
def _sweep(train: str, **settings: Any) -> dict[str, Any]:
    return {
        "kind": "sweep",
        "model": SPEC,
        "train_data": train,
        "eval_data": train,
        "sweep": settings,
    }


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (
            {"type": "batch", "target_loss": 2.0, "batch_sizes": [8, 16]},
            "body.sweep.batch_sizes",
        ),
        ({"type": "data", "data_sizes": [8, 16, 32]}, "body.sweep.data_sizes"),
        ({"type": "branch", "window_tokens": 10**12}, "body.sweep.window_tokens"),
    ],
)
def test_sweeps_the_worker_would_refuse_are_a_422(
    client: Any,
    auth_headers: dict[str, str],
    db_session: Any,
    body: dict[str, Any],
    field: str,
) -> None:
    """A batch sweep of 2 sizes and a data sweep of 3 were queued and failed in the worker's
    fit (MIN_POINTS); a branch window of 1e12 tokens failed in the worker's planner."""
    train = _upload(client, auth_headers, "dataset")
    request = _sweep(train, **body)
    if body["type"] == "branch":
        request["checkpoints"] = [_upload(client, auth_headers, "checkpoint")]
    before = _jobs(db_session)
    problem = assert_problem(client.post("/v1/jobs", json=request, headers=auth_headers), 422)
    assert error_fields(problem) == {field}
    assert _jobs(db_session) == before


def test_a_branch_sweep_of_a_hugging_face_model_is_a_422_at_the_model(
    client: Any, auth_headers: dict[str, str]
) -> None:
    train = _upload(client, auth_headers, "dataset")
    request = _sweep(train, type="branch", window_tokens=96)
    request["model"] = {
        "source": "huggingface",
        "config": {"model_type": "gpt2", "vocab_size": 11, "n_positions": 8, "n_embd": 8,
                   "n_layer": 1, "n_head": 2},
    }  # fmt: skip
    request["checkpoints"] = [str(uuid.uuid4())]
    problem = assert_problem(client.post("/v1/jobs", json=request, headers=auth_headers), 422)
    assert error_fields(problem) == {"body.model"}


def test_an_infinite_layer_norm_epsilon_is_a_422(client: Any, auth_headers: dict[str, str]) -> None:
    checkpoint = _upload(client, auth_headers, "checkpoint")
    dataset = _upload(client, auth_headers, "dataset")
    spec = json.dumps(SPEC)[:-1] + ', "ln_eps": 1e999}'
    raw = (
        f'{{"kind": "analyze", "model": {spec}, "checkpoint": "{checkpoint}", '
        f'"dataset": "{dataset}"}}'
    )
    problem = assert_problem(_post_raw(client, auth_headers, raw), 422)
    assert error_fields(problem) == {"body.model.ln_eps"}


# --------------------------------------------------------------------------- finding 8
def test_a_huge_unknown_field_name_is_not_echoed_in_full(
    client: Any, auth_headers: dict[str, str], plan_body: dict[str, Any]
) -> None:
    name = "x" * 1_000_000
    plan_body[name] = 1
    response = client.post("/v1/jobs", json=plan_body, headers=auth_headers)
    problem = assert_problem(response, 422)
    assert len(response.content) < 10_000
    [error] = problem["errors"]
    assert error["type"] == "extra_forbidden"
    assert error["field"].startswith("body.xxxx") and "1000000 characters" in error["field"]
    assert error["loc"][0] == "body" and len(error["loc"][1]) < 300
    assert len(problem["detail"]) < 3000


def test_thousands_of_field_errors_are_listed_up_to_a_bound(
    client: Any, auth_headers: dict[str, str], plan_body: dict[str, Any]
) -> None:
    for i in range(5000):
        plan_body[f"unknown_{i}"] = i
    response = client.post("/v1/jobs", json=plan_body, headers=auth_headers)
    problem = assert_problem(response, 422)
    assert len(problem["errors"]) == 100 and problem["errors_omitted"] == 4900
    assert len(response.content) < 50_000
