"""Generated requests for every operation of the OpenAPI document, valid and invalid, under
every schemathesis check: never a 5xx, always the schema, valid data accepted, invalid refused.

Bounded examples per operation and mode and a fixed seed (derandomized), against the
in-process app on the real test database and no worker, so generated jobs stay queued until
the fuzzing's project is deleted at the end.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode, checks

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

#: Examples per operation and generation mode (positive, negative): the run fits a 2-minute
#: share of a 2-core machine.
EXAMPLES_PER_OPERATION = 10
#: Every check schemathesis has (not a 5xx; status code, content type, headers and body as
#: documented; schema-valid data accepted and invalid data refused; the Allow header of a 405;
#: missing required headers; ignored auth; …) runs on every operation, except these, each
#: with its reason.
checks.load_all_checks()
ALL_CHECKS = list(checks.CHECKS.get_all())  # the 14 built-ins, not only the default set
_TOKEN = "page_token is an opaque cursor: a schema-valid string that is not one we issued is a 422"
EXCEPTIONS: dict[str, dict[Any, str]] = {
    "POST /v1/jobs": {
        checks.positive_data_acceptance: "a job body has cross-field rules no JSON schema states: "
        "loss_bound ≥ every loss, artifact ids that exist in the project, a from_job that is "
        "a succeeded analysis, the planner's work limits over losses × orderings",
    },
    "POST /v1/artifacts": {
        checks.positive_data_acceptance: "the file must be a safetensors file of the kind's "
        "dtypes: a schema says only 'binary'",
    },
    "GET /v1/jobs": {checks.positive_data_acceptance: _TOKEN},
    "GET /v1/artifacts": {checks.positive_data_acceptance: _TOKEN},
    "GET /v1/recommendations": {checks.positive_data_acceptance: _TOKEN},
}


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
def api_key_committed(engine: Any) -> Iterator[str]:
    """A committed key of a fresh project; the project, and every job and artifact the fuzzing
    committed in it, is deleted afterwards (the database is the session's: a worker another
    test starts on it would claim the queued jobs left behind)."""
    import uuid

    from sqlalchemy import text

    from curvplan_core.credentials.keys import create_key
    from curvplan_core.db import make_sessionmaker

    project = f"fuzz-{uuid.uuid4().hex[:8]}"
    with make_sessionmaker(engine)() as session:
        key = create_key(session, project)
        session.commit()
    yield key
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM project WHERE name = :n"), {"n": project})


def _fuzz(operation: Any, mode: GenerationMode, headers: dict[str, str]) -> Callable[[], None]:
    """A bounded, derandomized hypothesis run of one operation in one generation mode."""
    excluded = EXCEPTIONS.get(operation.label, {})
    run_checks = [check for check in ALL_CHECKS if check not in excluded]

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=EXAMPLES_PER_OPERATION,
        derandomize=True,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
        phases=[Phase.explicit, Phase.generate],
    )
    def run(case: Any) -> None:
        case.call_and_validate(headers=headers, checks=run_checks)

    return run


def test_no_5xx_and_schema_conformant(fuzz_app: Any) -> None:
    """Each operation gets its own run per generation mode: schema-valid requests must be
    accepted and answered as documented, invalid ones refused; failures are collected."""
    schema = schemathesis.openapi.from_asgi("/openapi.json", fuzz_app)
    # Unknown query parameters are ignored, as HTTP APIs commonly do (a newer client's filter
    # must not break an older server): they are not invalid data. Without this, a negative case
    # made only of extra query parameters is answered 200 and counted as "invalid accepted".
    schema.config.generation.update(allow_extra_parameters=False)
    headers = {"Authorization": f"Bearer {fuzz_app.state.fuzz_key}"}
    failures: list[str] = []
    operations = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        operations += 1
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            try:
                _fuzz(operation, mode, headers)()
            except Unsatisfiable:  # no parameters: no invalid request to make (GET /healthz)
                assert mode is GenerationMode.NEGATIVE, operation.label
            except (Exception, BaseExceptionGroup) as exc:  # schemathesis' FailureGroup
                failures.append(f"{operation.label} [{mode.value}]: {str(exc)[:1500]}")
    assert operations >= 10
    assert not failures, "\n\n".join(failures)
