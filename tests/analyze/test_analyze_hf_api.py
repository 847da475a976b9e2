"""POST /v1/jobs kind=analyze with Hugging Face models and sharded checkpoints: every refusal
is a 422 naming the field, before anything is queued (no torch, no transformers in the API)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save as st_save
from sqlalchemy import text

from curvplan.types.huggingface import parameter_count

GPT2 = {
    "model_type": "gpt2",
    "architectures": ["GPT2LMHeadModel"],
    "vocab_size": 13,
    "n_positions": 8,
    "n_embd": 8,
    "n_layer": 1,
    "n_head": 2,
}
SPEC = {
    "d_model": 8,
    "n_heads": 2,
    "d_ff": 16,
    "n_layers": 1,
    "task": {"type": "causal_lm", "vocab_size": 11, "seq_len": 6},
}


def _upload(client: Any, headers: dict[str, str], kind: str, tensors: dict[str, Any]) -> str:
    response = client.post(
        "/v1/artifacts",
        headers=headers,
        files={"file": ("f.safetensors", st_save(tensors), "application/octet-stream")},
        data={"kind": kind},
    )
    assert response.status_code == 201, response.text
    return response.json()["id"]


def _shard(names: list[str], seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal((2, 3)).astype(np.float32) for n in names}


def _hf_data(with_mask: bool = True) -> dict[str, Any]:
    ids = np.arange(24, dtype=np.int64).reshape(4, 6) % 13
    data = {"input_ids": ids}
    if with_mask:
        data["attention_mask"] = np.ones_like(ids)
    return data


def _post(client: Any, headers: dict[str, str], **body: Any) -> Any:
    return client.post("/v1/jobs", headers=headers, json={"kind": "analyze", **body})


def _errors(response: Any) -> list[tuple[str, str]]:
    assert response.status_code == 422, response.text
    return [(e["field"], e["message"]) for e in response.json()["errors"]]


def _jobs(db_session: Any) -> int:
    return db_session.execute(text("SELECT count(*) FROM job")).scalar_one()


def test_hf_model_with_shards_is_queued_with_its_config_as_sent(
    client: Any, auth_headers: dict[str, str]
) -> None:
    shards = [
        _upload(client, auth_headers, "checkpoint", _shard(["a.weight", "b.weight"])),
        _upload(client, auth_headers, "checkpoint", _shard(["c.weight"], seed=1)),
    ]
    # An intermediate is an earlier save of the same model: one file or the same shards.
    whole = _upload(
        client, auth_headers, "checkpoint", _shard(["a.weight", "b.weight", "c.weight"])
    )
    data = _upload(client, auth_headers, "dataset", _hf_data())
    config = {**GPT2, "some_future_field": {"kept": True}}
    response = _post(
        client,
        auth_headers,
        model={"source": "huggingface", "config": config},
        checkpoint=shards,
        dataset=data,
        intermediate_checkpoints=[whole, shards],
    )
    assert response.status_code == 202, response.text
    request = response.json()["request"]
    assert request["model"] == {"source": "huggingface", "config": config}
    assert request["checkpoint"] == shards
    assert request["intermediate_checkpoints"] == [whole, shards]


def test_refused_configs_name_the_field_and_queue_nothing(
    client: Any, auth_headers: dict[str, str], db_session: Any
) -> None:
    ckpt = _upload(client, auth_headers, "checkpoint", _shard(["a.weight"]))
    data = _upload(client, auth_headers, "dataset", _hf_data())
    before = _jobs(db_session)

    def post(config: dict[str, Any]) -> Any:
        model = {"source": "huggingface", "config": config}
        return _post(client, auth_headers, model=model, checkpoint=ckpt, dataset=data)

    [(field, message)] = _errors(post({**GPT2, "auto_map": {"AutoModelForCausalLM": "m.M"}}))
    assert field == "body.model.config.auto_map" and "remote code" in message
    [(field, message)] = _errors(post({"model_type": "bert", "vocab_size": 10}))
    assert field == "body.model.config.model_type"
    assert "'bert'" in message and "GPT2LMHeadModel" in message and "LlamaForCausalLM" in message
    [(field, message)] = _errors(post({**GPT2, "architectures": ["GPT2ForTokenClassification"]}))
    assert field == "body.model.config.architectures" and "GPT2LMHeadModel" in message
    [(field, _)] = _errors(
        _post(
            client,
            auth_headers,
            model={"source": "hub", "config": GPT2},
            checkpoint=ckpt,
            dataset=data,
        )
    )
    assert field == "body.model"
    assert _jobs(db_session) == before


@pytest.fixture
def settings(database_url: str, tmp_path: Any) -> Any:
    from curvplan_core.config import Settings

    # GPT-2 small is over this limit, the tiny GPT-2 under it.
    return Settings(
        database_url=database_url,
        auth_disabled=False,
        log_format="console",
        data_dir=tmp_path / "data",
        max_model_parameters=100_000_000,
    )


def test_a_model_above_the_parameter_limit_is_refused_before_queueing(
    client: Any, auth_headers: dict[str, str], db_session: Any
) -> None:
    ckpt = _upload(client, auth_headers, "checkpoint", _shard(["a.weight"]))
    data = _upload(client, auth_headers, "dataset", _hf_data())
    before = _jobs(db_session)
    big = {"model_type": "gpt2"}  # every default: GPT-2 small
    response = _post(
        client,
        auth_headers,
        model={"source": "huggingface", "config": big},
        checkpoint=ckpt,
        dataset=data,
    )
    [(field, message)] = _errors(response)
    assert field == "body.model.config"
    assert f"{parameter_count(big):,}" in message and "100,000,000" in message
    assert _jobs(db_session) == before
    small = _post(
        client,
        auth_headers,
        model={"source": "huggingface", "config": GPT2},
        checkpoint=ckpt,
        dataset=data,
    )
    assert small.status_code == 202, small.text


def test_shards_and_dataset_layout_are_checked_from_the_stored_headers(
    client: Any, auth_headers: dict[str, str], other_auth_headers: dict[str, str]
) -> None:
    first = _upload(client, auth_headers, "checkpoint", _shard(["a.weight", "b.weight"]))
    repeat = _upload(client, auth_headers, "checkpoint", _shard(["c.weight", "b.weight"], 1))
    hf_data = _upload(client, auth_headers, "dataset", _hf_data())
    hf_model = {"source": "huggingface", "config": GPT2}

    response = _post(
        client, auth_headers, model=hf_model, checkpoint=[first, repeat], dataset=hf_data
    )
    [(field, message)] = _errors(response)
    assert field == "body.checkpoint.1"
    assert "'b.weight'" in message and "body.checkpoint.0" in message

    theirs = _upload(client, other_auth_headers, "checkpoint", _shard(["z.weight"], 2))
    response = _post(
        client, auth_headers, model=hf_model, checkpoint=[first, theirs], dataset=hf_data
    )
    [(field, message)] = _errors(response)
    assert field == "body.checkpoint.1" and "not found in this project" in message
    [(field, _)] = _errors(
        _post(client, auth_headers, model=hf_model, checkpoint=[first, first], dataset=hf_data)
    )
    assert field == "body.checkpoint"
    [(field, _)] = _errors(
        _post(client, auth_headers, model=hf_model, checkpoint=[], dataset=hf_data)
    )
    assert field == "body.checkpoint"

    # GPT-2's learned positions end at n_positions (8 here).
    long = _upload(client, auth_headers, "dataset", {"input_ids": np.zeros((2, 9), np.int64)})
    [(field, message)] = _errors(
        _post(client, auth_headers, model=hf_model, checkpoint=first, dataset=long)
    )
    assert field == "body.dataset" and "9 tokens" in message and "n_positions (8)" in message

    # The reference spec reads {inputs, targets} only.
    [(field, message)] = _errors(
        _post(client, auth_headers, model=SPEC, checkpoint=first, dataset=hf_data)
    )
    assert field == "body.dataset" and "input_ids" in message


@pytest.mark.parametrize(
    ("tensors", "tensor", "words"),
    [
        ({"input_ids": np.zeros((3, 5), np.float32)}, "input_ids", "integers"),
        ({"input_ids": np.zeros((3, 1), np.int64)}, "input_ids", "length ≥ 2"),
        ({"input_ids": np.zeros(5, np.int64)}, "input_ids", "shape"),
        (
            {"input_ids": np.zeros((3, 5), np.int64), "labels": np.zeros((3, 4), np.int64)},
            "labels",
            "differs",
        ),
        (
            {
                "input_ids": np.zeros((3, 5), np.int64),
                "attention_mask": np.zeros((3, 5), np.float32),
            },
            "attention_mask",
            "integer",
        ),
        (
            {"input_ids": np.zeros((3, 5), np.int64), "targets": np.zeros((3, 5), np.int64)},
            "input_ids",
            "do not mix",
        ),
        ({"input_ids": np.zeros((3, 5), np.int64), "pixels": np.zeros(3)}, "pixels", "unexpected"),
    ],
)
def test_hf_dataset_uploads_are_checked_naming_the_tensor(
    client: Any, auth_headers: dict[str, str], tensors: dict[str, Any], tensor: str, words: str
) -> None:
    response = client.post(
        "/v1/artifacts",
        headers=auth_headers,
        files={"file": ("d.safetensors", st_save(tensors), "application/octet-stream")},
        data={"kind": "dataset"},
    )
    assert response.status_code == 422, response.text
    assert f"'{tensor}'" in response.text and words in response.text


def test_bool_masks_and_known_buffers_are_accepted(
    client: Any, auth_headers: dict[str, str]
) -> None:
    ids = np.zeros((2, 4), np.int64)
    _upload(client, auth_headers, "dataset", {"input_ids": ids, "attention_mask": ids == 0})
    buffers = {
        "transformer.h.0.attn.bias": np.ones((1, 1, 4, 4), bool),
        "transformer.h.0.ln_1.weight": np.ones(4, np.float32),
    }
    _upload(client, auth_headers, "checkpoint", buffers)
    response = client.post(
        "/v1/artifacts",
        headers=auth_headers,
        files={
            "file": (
                "c.safetensors",
                st_save({"h.0.ln_1.weight": np.ones(4, np.int64)}),
                "application/octet-stream",
            )
        },
        data={"kind": "checkpoint"},
    )
    assert response.status_code == 422 and "h.0.ln_1.weight" in response.text


@pytest.mark.parametrize(
    ("fragment", "field"),
    [
        ('"layer_norm_epsilon": NaN', "body.model.config.layer_norm_epsilon"),
        (
            '"task_specific_params": {"x": [1, -Infinity]}',
            "body.model.config.task_specific_params.x.1",
        ),
        ('"initializer_range": Infinity', "body.model.config.initializer_range"),
    ],
)
def test_nan_or_infinity_in_a_config_is_a_422_naming_it(
    client: Any, auth_headers: dict[str, str], db_session: Any, fragment: str, field: str
) -> None:
    """Python's JSON parser takes NaN and Infinity; jsonb stored them as null and the job
    failed later with internal-error."""
    ckpt = _upload(client, auth_headers, "checkpoint", _shard(["a.weight"]))
    data = _upload(client, auth_headers, "dataset", _hf_data())
    before = _jobs(db_session)
    config = json.dumps(GPT2)[:-1] + ", " + fragment + "}"
    raw = (
        '{"kind": "analyze", "model": {"source": "huggingface", "config": ' + config + "}, "
        f'"checkpoint": "{ckpt}", "dataset": "{data}"' + "}"
    )
    response = client.post(
        "/v1/jobs", headers={**auth_headers, "Content-Type": "application/json"}, content=raw
    )
    assert [f for f, _ in _errors(response)] == [field]
    assert _jobs(db_session) == before
