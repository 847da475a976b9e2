"""The client's analyze body carries ``resources.devices``, and the contract checks it."""

from __future__ import annotations

import uuid

import pytest
from pydantic import ValidationError

from curvplan.client._common import analyze_body
from curvplan.types.jobs import AnalyzeJobCreate

SPEC = {
    "d_model": 4,
    "n_heads": 2,
    "d_ff": 6,
    "n_layers": 1,
    "task": {"type": "regression", "seq_len": 3},
}


def _body(devices: int | None) -> dict:
    ids = str(uuid.uuid4()), str(uuid.uuid4())
    return analyze_body(SPEC, ids[0], ids[1], None, None, None, None, None, devices=devices)


def test_devices_become_resources_and_default_to_one():
    assert _body(2)["resources"] == {"devices": 2}
    assert AnalyzeJobCreate.model_validate(_body(2)).resources.devices == 2
    assert "resources" not in _body(None)
    assert AnalyzeJobCreate.model_validate(_body(None)).resources.devices == 1
    with pytest.raises(ValidationError, match=r"resources\.devices"):
        AnalyzeJobCreate.model_validate(_body(0))
