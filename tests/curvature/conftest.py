"""Fixtures of the engine tests; the models and the dense oracle live in _engine_cases.py."""

from __future__ import annotations

import pytest
import torch
from _engine_cases import CASES, Case, build_case


@pytest.fixture
def single_thread():
    """Tiny models run fastest on one intra-op thread (and the CI box has 2 shared cores)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session", params=list(CASES))
def case(request) -> Case:
    return build_case(request.param)


@pytest.fixture(scope="session")
def lm_case() -> Case:
    return build_case("lm_post_gelu_tied")
