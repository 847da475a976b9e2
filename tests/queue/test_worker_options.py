"""``curvplan worker`` options: defaults from the environment, overrides, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from curvplan.cli import app
from curvplan_core.config import Settings
from curvplan_worker.kinds import KINDS, UnknownKindError, load_run, modules_for_queues
from curvplan_worker.options import WorkerOptions

URL = "postgresql+psycopg://postgres@127.0.0.1:5432/unused"


def settings(**values: object) -> Settings:
    return Settings(database_url=URL, **values)  # type: ignore[arg-type]


def test_options_come_from_settings_and_overrides():
    opts = WorkerOptions.from_settings(
        settings(lease_seconds=20, heartbeat_seconds=4, data_dir=Path("/tmp/d")),
        ["cpu", "gpu"],
        poll_interval=0.5,
        concurrency=None,  # None means "not given"
    )
    assert (opts.lease_seconds, opts.heartbeat_seconds, opts.poll_interval) == (20, 4, 0.5)
    assert opts.queues == ("cpu", "gpu") and opts.concurrency == 1
    assert opts.data_dir == Path("/tmp/d") and opts.database_url == URL


def test_curvplan_url_makes_a_worker_of_another_host(monkeypatch):
    monkeypatch.setenv("CURVPLAN_URL", "http://api.example:8000/")
    monkeypatch.setenv("DATABASE_URL", URL)
    opts = WorkerOptions.from_settings(Settings(), ["gpu"])
    assert opts.api_url == "http://api.example:8000"  # the base URL, without the slash
    monkeypatch.setenv("CURVPLAN_URL", "")
    assert WorkerOptions.from_settings(Settings(), ["gpu"]).api_url is None  # one host


def test_a_short_lease_shortens_the_heartbeat():
    opts = WorkerOptions.from_settings(settings(heartbeat_seconds=5), ["cpu"], lease_seconds=3)
    assert opts.heartbeat_seconds == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"lease_seconds": 2, "heartbeat_seconds": 1.5}, "at most half of lease_seconds"),
        ({"concurrency": 0}, "concurrency"),
        ({"start_method": "fork"}, "forkserver"),
    ],
)
def test_inconsistent_options_are_refused(overrides, message):
    with pytest.raises(ValueError, match=message):
        WorkerOptions.from_settings(settings(), ["cpu"], **overrides)


def test_each_queue_preloads_only_its_own_kinds():
    # no torch on cpu workers: the plan kind and the sweep's parent (fan-out and fit)
    assert modules_for_queues(["cpu"]) == [
        "curvplan_worker.kinds.plan",
        "curvplan_worker.kinds.sweep",
    ]
    assert modules_for_queues(["gpu"]) == [
        "curvplan_worker.kinds.analyze",
        "curvplan_worker.kinds.sweep_point",
        "curvplan_worker.kinds.analyze_blocks",  # an analysis's block fan-out children
    ]
    assert set(modules_for_queues(["cpu", "gpu"])) == {spec.module for spec in KINDS.values()}


def test_every_kind_matches_the_api_queue_and_has_a_run_function():
    from curvplan.types.jobs import QUEUE_OF_KIND

    assert {name: spec.queue for name, spec in KINDS.items()} == QUEUE_OF_KIND
    for name in KINDS:
        assert callable(load_run(name))
    with pytest.raises(UnknownKindError, match="unknown job kind 'nope'"):
        load_run("nope")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--queues", "cpu,tpu"], "subset of cpu,gpu"),
        (["--queues", "cpu", "--lease-seconds", "2", "--heartbeat-seconds", "1.5"], "half"),
        (["--device", "tpu"], "expected auto, cpu or cuda"),
        (["--memory-budget", "lots"], "CURVPLAN_WORKER_MEMORY_BUDGET: expected a size in bytes"),
        (["--memory-budget", "0GiB"], "CURVPLAN_WORKER_MEMORY_BUDGET"),
    ],
)
def test_cli_rejects_bad_options_with_a_clear_message(monkeypatch, args, message):
    from curvplan_core.config import get_settings

    monkeypatch.setenv("DATABASE_URL", URL)
    monkeypatch.setenv("CURVPLAN_WORKER_DEVICE", "auto")  # the command sets it from --device
    monkeypatch.setenv("CURVPLAN_WORKER_MEMORY_BUDGET", "")  # … and this from --memory-budget
    get_settings.cache_clear()
    try:
        result = CliRunner().invoke(app, ["worker", *args])
    finally:
        get_settings.cache_clear()
    assert result.exit_code == 2
    assert message in " ".join(result.output.split()), result.output
    assert "Traceback" not in result.output


def test_cli_needs_a_database_url(monkeypatch):
    from curvplan_core.config import get_settings

    monkeypatch.delenv("DATABASE_URL", raising=False)
    get_settings.cache_clear()
    try:
        result = CliRunner().invoke(app, ["worker"])
    finally:
        get_settings.cache_clear()
    assert result.exit_code == 2
    assert "DATABASE_URL" in result.output
