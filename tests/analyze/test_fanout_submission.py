"""POST /v1/jobs kind=analyze: the fan-out is decided once, at submission, by cost, and the
admission refuses what cannot fit or finish (in-process API, real PostgreSQL, no worker)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import torch

SPEC: dict[str, Any] = {
    "d_model": 16,
    "n_heads": 2,
    "d_ff": 32,
    "n_layers": 1,
    "task": {"type": "causal_lm", "vocab_size": 11, "seq_len": 6},
}


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Any:
    """The API with a workers' memory limit and a one-minute analyze time limit."""
    from curvplan_core.config import Settings

    return Settings(
        database_url=database_url,
        auth_disabled=False,
        log_format="console",
        data_dir=tmp_path / "data",
        worker_memory_limit=4 * 2**30,
        job_time_limits={"analyze": 60.0, "analyze_blocks": 3600.0},
    )


def _upload(client: Any, headers: dict[str, str], tensors: dict[str, Any], kind: str) -> str:
    from safetensors.torch import save

    response = client.post(
        "/v1/artifacts",
        headers=headers,
        files={"file": ("f.safetensors", io.BytesIO(save(tensors)), "application/octet-stream")},
        data={"kind": kind},
    )
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


@pytest.fixture
def artifacts(client: Any, auth_headers: dict[str, str]) -> dict[str, str]:
    from curvplan_worker.curvature.model import build_model

    state = {k: v.detach().contiguous() for k, v in build_model(SPEC, seed=1).state_dict().items()}
    tokens = torch.randint(0, 11, (8, 7), generator=torch.Generator().manual_seed(0))
    data = {"inputs": tokens[:, :-1].contiguous(), "targets": tokens[:, 1:].contiguous()}
    return {
        "checkpoint": _upload(client, auth_headers, state, "checkpoint"),
        "dataset": _upload(client, auth_headers, data, "dataset"),
    }


def _post(client: Any, headers: dict[str, str], artifacts: dict[str, str], **fields: Any) -> Any:
    body = {"kind": "analyze", "model": SPEC, **artifacts, **fields}
    return client.post("/v1/jobs", headers=headers, json=body)


GPT2 = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_positions": 1024}


def _post_hf(
    client: Any, headers: dict[str, str], config: dict[str, Any], checkpoint: str, data: str
) -> Any:
    """A Hugging Face analysis; its checkpoint is never read (refused before it is queued)."""
    body = {
        "kind": "analyze",
        "model": {"source": "huggingface", "config": config},
        "checkpoint": checkpoint,
        "dataset": data,
        "options": {"fan_out": False},
    }
    return client.post("/v1/jobs", headers=headers, json=body)


def test_a_small_analysis_is_queued_alone(client, auth_headers, artifacts) -> None:
    response = _post(client, auth_headers, artifacts, options={"trace_probes": 0})
    assert response.status_code == 202, response.text
    job = response.json()
    assert job["status"] == "queued" and "children" not in job
    got = client.get(f"/v1/jobs/{job['id']}", headers=auth_headers).json()
    assert got["status"] == "queued" and not got.get("children")


def test_a_forced_fan_out_creates_the_children_at_submission_with_the_parent_waiting(
    client, auth_headers, artifacts
) -> None:
    from curvplan_worker.curvature.blocks import default_blocks
    from curvplan_worker.curvature.model import build_model

    options = {"fan_out": True, "fan_out_groups": 3, "off_diagonal": [["layers.0.q", "head"]]}
    response = _post(client, auth_headers, artifacts, options=options)
    assert response.status_code == 202, response.text
    parent = response.json()
    # The parent waits for its children, which exist already: it never ran an attempt.
    assert parent["status"] == "running" and parent["attempt"] == 0
    assert parent["progress"]["stage"] == "waiting for children"
    assert [m["stage"] for m in parent["progress"]["stages"]] == ["waiting for children"]
    children = parent["children"]
    assert len(children) == 3
    assert {(c["kind"], c["status"], c["attempt"]) for c in children} == {
        ("analyze_blocks", "queued", 0)
    }
    got = client.get(f"/v1/jobs/{parent['id']}", headers=auth_headers).json()
    assert [c["id"] for c in got["children"]] == [c["id"] for c in children]
    requests = [client.get(f"/v1/jobs/{c['id']}", headers=auth_headers).json() for c in children]
    # Every block of the model exactly once, the pair once, each child costed in seconds.
    blocks = [b for child in requests for b in child["request"]["blocks"]]
    pairs = [tuple(p) for child in requests for p in child["request"]["pairs"]]
    assert sorted(blocks) == sorted(default_blocks(build_model(SPEC, seed=1)))  # the engine's
    assert pairs == [("layers.0.q", "head")]
    assert all(child["parent_id"] == parent["id"] for child in requests)
    # ETAs before anything runs: each child's prior estimate; the parent's, the slowest
    # child's plus its fan-in's
    etas = [child["progress"]["eta_seconds"] for child in requests]
    assert all(e > 0 for e in etas)
    assert all(
        child["progress"]["eta_seconds"] == pytest.approx(child["request"]["estimated_cost"])
        for child in requests
    )
    assert parent["progress"]["eta_seconds"] >= max(etas)


def test_fan_out_false_and_a_single_block_never_fan_out(client, auth_headers, artifacts) -> None:
    one_block = _post(
        client, auth_headers, artifacts, options={"fan_out": True, "blocks": ["layers.0.ffn_in"]}
    )
    never = _post(client, auth_headers, artifacts, options={"fan_out": False})
    for response in (one_block, never):
        assert response.status_code == 202, response.text
        assert response.json()["status"] == "queued" and "children" not in response.json()


def test_an_analysis_past_its_time_limit_is_refused_before_it_is_queued(
    client, auth_headers, artifacts
) -> None:

    # A GPT-2 of distilgpt2's width (87 M parameters: fits the 4 GiB) on 64 × 1024 tokens:
    # seconds per product at the prior, hours for its ~100 blocks, past the 60 s limit.
    config = {**GPT2, "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 1000}
    ids = torch.randint(0, 1000, (64, 1024), generator=torch.Generator().manual_seed(0))
    data = _upload(client, auth_headers, {"input_ids": ids}, "dataset")
    before = client.get("/v1/jobs", headers=auth_headers).json()["items"]
    response = _post_hf(client, auth_headers, config, artifacts["checkpoint"], data)
    assert response.status_code == 422, response.text
    problem = response.json()
    [error] = problem["errors"]
    assert error["field"] == "body.options" and error["type"] == "over-time-limit"
    assert "products ×" in error["message"] and "60 s limit" in error["message"]
    for option in ("max_iter", "tolerance", "blocks", "trace_probes"):
        assert option in error["message"], error["message"]
    assert "over-time-limit" in problem["detail"]
    assert client.get("/v1/jobs", headers=auth_headers).json()["items"] == before


def test_an_analysis_that_cannot_fit_the_workers_memory_is_refused_before_it_is_queued(
    client, auth_headers, artifacts
) -> None:
    # A Hugging Face model of 1.3 B parameters: its weights, gradient and two product vectors
    # alone are 19 GiB, past the workers' 4 GiB limit (its parameters come from the config).
    config = {**GPT2, "n_embd": 2048, "n_layer": 24, "n_head": 16, "vocab_size": 50257}
    ids = torch.randint(0, 100, (4, 16), generator=torch.Generator().manual_seed(0))
    data = _upload(client, auth_headers, {"input_ids": ids}, "dataset")
    response = _post_hf(client, auth_headers, config, artifacts["checkpoint"], data)
    assert response.status_code == 422, response.text
    errors = {e["type"]: e for e in response.json()["errors"]}  # over-time-limit too (1.3 B)
    error = errors["too-large"]
    assert error["field"] == "body.options"
    message = error["message"]
    assert "GiB" in message and "Lanczos basis" in message and "parameters" in message
    assert "4.00 GiB (CURVPLAN_WORKER_MEMORY_LIMIT)" in message
    assert "blocks" in message and "precision" in message
    assert json.dumps(response.json())  # problem+json, no 500


def test_the_admission_plans_block_definitions_in_the_stored_rows_key_order(db_session) -> None:
    """The typed options keep the client's key order; the worker reads the stored row's (jsonb:
    shorter keys first). The admission plans with the row's order, so it names the blocks the
    worker's engine will find, in the same order."""
    from curvplan.types.options import AnalysisOptions
    from curvplan_server.analyze.admission import _stored_order

    definitions = {"mlp_and_head": ["head.*"], "embed": ["embed.*"], "q": ["layers.0.q*"]}
    options = AnalysisOptions(block_definitions=definitions, seed=4)
    stored = _stored_order(db_session, options)
    assert list(options.block_definitions or {}) == ["mlp_and_head", "embed", "q"]
    assert list(stored.block_definitions or {}) == ["q", "embed", "mlp_and_head"]
    assert stored.block_definitions == definitions and stored.seed == 4
    one = AnalysisOptions(block_definitions={"only": ["head.*"]})
    assert _stored_order(db_session, one) is one  # nothing to reorder: no round trip
