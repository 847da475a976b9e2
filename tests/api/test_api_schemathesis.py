"""Generated requests for every operation of the OpenAPI document: never a 5xx, always the schema.

Bounded examples per operation and a fixed seed (derandomized), against the in-process
app on the real test database and no worker, so generated jobs stay queued.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import checks

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

EXAMPLES_PER_OPERATION = 12
# No 5xx, and every answer as documented (status, content type, headers, body schema).
# Not "positive data acceptance": a schema cannot say everything a valid body must be.
CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_headers_conformance,
    checks.response_schema_conformance,
]


@pytest.fixture
def settings_(database_url: str, tmp_path: Path) -> Any:
    from curvplan_core.config import Settings

    root = tmp_path / "uri-root"
    root.mkdir()
    return Settings(
        database_url=database_url,
        auth_disabled=False,
        log_format="console",
        data_dir=tmp_path / "data",
        artifact_uri_roots=[root],
        long_poll_max_seconds=0.2,
        max_artifact_bytes=1 << 20,
    )


@pytest.fixture
def fuzz_app(settings_: Any, engine: Any, api_key_committed: str) -> Any:
    """The real app (its own sessions, committed) with a key, schemathesis' bearer."""
    from curvplan_server.main import create_app

    application = create_app(settings_)
    application.state.fuzz_key = api_key_committed
    yield application
    application.state.engine.dispose()


@pytest.fixture
def api_key_committed(engine: Any) -> str:
    import uuid

    from curvplan_core.credentials.keys import create_key
    from curvplan_core.db import make_sessionmaker

    with make_sessionmaker(engine)() as session:
        key = create_key(session, f"fuzz-{uuid.uuid4().hex[:8]}")
        session.commit()
    return key


def test_no_5xx_and_schema_conformant(fuzz_app: Any) -> None:
    """Each operation gets its own bounded, derandomized run; failures are collected."""
    schema = schemathesis.openapi.from_asgi("/openapi.json", fuzz_app)
    headers = {"Authorization": f"Bearer {fuzz_app.state.fuzz_key}"}
    failures: list[str] = []
    operations = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        operations += 1

        @given(case=operation.as_strategy())
        @settings(
            max_examples=EXAMPLES_PER_OPERATION,
            derandomize=True,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
            phases=[Phase.explicit, Phase.generate],
        )
        def run(case: Any) -> None:
            case.call_and_validate(headers=headers, checks=CHECKS)

        try:
            run()
        except (Exception, BaseExceptionGroup) as exc:  # schemathesis' FailureGroup
            failures.append(f"{operation.label}: {str(exc)[:1500]}")
    assert operations >= 10
    assert not failures, "\n\n".join(failures)
