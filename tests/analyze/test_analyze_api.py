"""POST /v1/jobs kind=analyze: validated (spec, artifact ids, project) before it is queued."""

from __future__ import annotations

import subprocess
import sys
import uuid
from typing import Any

import numpy as np
from safetensors.numpy import save as st_save

SPEC = {
    "d_model": 8,
    "n_heads": 2,
    "d_ff": 16,
    "n_layers": 1,
    "task": {"type": "causal_lm", "vocab_size": 11, "seq_len": 6},
}


def _upload(client: Any, headers: dict[str, str], kind: str, seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    if kind == "checkpoint":
        tensors = {"embed.weight": rng.standard_normal((11, 8)).astype(np.float32)}
    else:
        tokens = rng.integers(0, 11, size=(4, 6)).astype(np.int64)
        tensors = {"inputs": tokens, "targets": tokens}
    response = client.post(
        "/v1/artifacts",
        headers=headers,
        files={"file": ("f.safetensors", st_save(tensors), "application/octet-stream")},
        data={"kind": kind},
    )
    assert response.status_code == 201, response.text
    return response.json()["id"]


def _body(checkpoint: str, dataset: str, **extra: Any) -> dict[str, Any]:
    return {
        "kind": "analyze",
        "name": "tiny-lm",
        "model": SPEC,
        "checkpoint": checkpoint,
        "dataset": dataset,
        **extra,
    }


def _fields(response: Any) -> list[str]:
    assert response.status_code == 422, response.text
    return [e["field"] for e in response.json()["errors"]]


def test_valid_analyze_job_is_queued_on_the_gpu_queue(
    client: Any, auth_headers: dict[str, str]
) -> None:
    ckpt = _upload(client, auth_headers, "checkpoint")
    data = _upload(client, auth_headers, "dataset")
    body = _body(ckpt, data, options={"seed": 3, "precision": "float64"})
    response = client.post("/v1/jobs", headers=auth_headers, json=body)
    assert response.status_code == 202, response.text
    job = response.json()
    assert (job["kind"], job["queue"], job["status"]) == ("analyze", "gpu", "queued")
    assert job["request"]["checkpoint"] == ckpt
    assert job["request"]["options"] == {"seed": 3, "precision": "float64"}


def test_bad_spec_and_options_name_the_field(client: Any, auth_headers: dict[str, str]) -> None:
    ckpt = _upload(client, auth_headers, "checkpoint")
    data = _upload(client, auth_headers, "dataset")
    bad_spec = {**SPEC, "n_heads": 3}  # 8 is not divisible by 3
    assert _fields(
        client.post("/v1/jobs", headers=auth_headers, json=_body(ckpt, data, model=bad_spec))
    ) == ["body.model"]
    unknown = {**SPEC, "colour": "red"}
    assert _fields(
        client.post("/v1/jobs", headers=auth_headers, json=_body(ckpt, data, model=unknown))
    ) == ["body.model.colour"]
    assert _fields(
        client.post(
            "/v1/jobs", headers=auth_headers, json=_body(ckpt, data, options={"tolerance": -1})
        )
    ) == ["body.options.tolerance"]
    assert _fields(
        client.post("/v1/jobs", headers=auth_headers, json=_body("not-a-uuid", data))
    ) == ["body.checkpoint"]


def test_machine_settings_and_bound_option_typos_are_422_naming_the_field(
    client: Any, auth_headers: dict[str, str]
) -> None:
    ckpt = _upload(client, auth_headers, "checkpoint")
    data = _upload(client, auth_headers, "dataset")
    settings = (("device", "cpu"), ("threads", 2), ("self_test", False), ("memory_budget", "8GiB"))
    for name, value in settings:
        response = client.post(
            "/v1/jobs", headers=auth_headers, json=_body(ckpt, data, options={name: value})
        )
        assert _fields(response) == [f"body.options.{name}"]
        (error,) = response.json()["errors"]
        assert (
            "worker setting" in error["message"]
            and f"CURVPLAN_WORKER_{name.upper()}" in (error["message"])
        )
    typo = _body(ckpt, data, options={"bound_options": {"mdoe": "exact"}})
    assert _fields(client.post("/v1/jobs", headers=auth_headers, json=typo)) == [
        "body.options.bound_options.mdoe"
    ]
    wrong = _body(ckpt, data, options={"bound_options": {"c_A": "1/3"}})
    assert _fields(client.post("/v1/jobs", headers=auth_headers, json=wrong)) == [
        "body.options.bound_options.c_A"
    ]
    good = _body(ckpt, data, options={"bound_options": {"mode": "exact", "max_samples": 4}})
    response = client.post("/v1/jobs", headers=auth_headers, json=good)
    assert response.status_code == 202, response.text
    assert response.json()["request"]["options"]["bound_options"] == {
        "mode": "exact",
        "max_samples": 4,
    }


def test_a_request_queued_with_machine_settings_still_runs_without_them() -> None:
    import json

    import pytest
    from pydantic import ValidationError

    from curvplan.types.jobs import AnalyzeJobCreate
    from curvplan_worker.kinds import load_request

    old = _body(str(uuid.uuid4()), str(uuid.uuid4()), options={"self_test": False, "seed": 2})
    body = load_request("analyze", json.dumps(old))
    assert isinstance(body, AnalyzeJobCreate)
    assert body.options.seed == 2
    assert "self_test" not in body.options.model_dump(mode="json")
    with pytest.raises(ValidationError, match="worker setting"):  # a client's is still a 422
        AnalyzeJobCreate.model_validate_json(json.dumps(old))


def test_the_contract_bound_options_are_the_engines() -> None:
    from dataclasses import asdict

    from curvplan.types.options import BoundsOptions
    from curvplan_worker.curvature.bounds.options import BoundOptions

    assert BoundsOptions().model_dump() == asdict(BoundOptions())


def test_artifact_of_another_project_or_wrong_kind_is_422_naming_the_field(
    client: Any, auth_headers: dict[str, str], other_auth_headers: dict[str, str], db_session: Any
) -> None:
    from sqlalchemy import text

    mine_ckpt = _upload(client, auth_headers, "checkpoint")
    mine_data = _upload(client, auth_headers, "dataset")
    theirs = _upload(client, other_auth_headers, "checkpoint", seed=1)
    jobs_before = db_session.execute(text("SELECT count(*) FROM job")).scalar_one()

    response = client.post("/v1/jobs", headers=auth_headers, json=_body(theirs, mine_data))
    assert _fields(response) == ["body.checkpoint"]
    assert "not found in this project" in response.json()["errors"][0]["message"]
    # A random id gets the very same answer: nothing tells whether the id exists elsewhere.
    unknown = client.post(
        "/v1/jobs", headers=auth_headers, json=_body(str(uuid.uuid4()), mine_data)
    )
    assert _fields(unknown) == ["body.checkpoint"]
    assert unknown.json()["errors"][0]["type"] == response.json()["errors"][0]["type"]

    swapped = client.post("/v1/jobs", headers=auth_headers, json=_body(mine_data, mine_ckpt))
    assert sorted(_fields(swapped)) == ["body.checkpoint", "body.dataset"]

    intermediate = client.post(
        "/v1/jobs",
        headers=auth_headers,
        json=_body(mine_ckpt, mine_data, intermediate_checkpoints=[mine_ckpt, theirs]),
    )
    assert _fields(intermediate) == ["body.intermediate_checkpoints.1"]
    assert db_session.execute(text("SELECT count(*) FROM job")).scalar_one() == jobs_before


def test_the_api_process_never_imports_torch() -> None:
    code = (
        "import sys, curvplan_server.main; curvplan_server.main.create_app; "
        "from curvplan.types.jobs import JOB_CREATE_ADAPTER; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
