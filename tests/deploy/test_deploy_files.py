"""Dockerfile and docker-compose.yml (no Docker engine here): parse them and check them."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from curvplan.cli import app as cli

ROOT = Path(__file__).resolve().parents[2]


def _stages() -> dict[str, list[str]]:
    """Dockerfile instructions per stage name (continuation lines joined)."""
    text = (ROOT / "Dockerfile").read_text()
    text = re.sub(r"\\\n", " ", text)
    stages: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = re.match(r"FROM\s+(\S+)(?:\s+AS\s+(\S+))?", line, re.IGNORECASE)
        if match:
            current = match.group(2) or match.group(1)
            stages[current] = [line]
            continue
        assert current is not None, f"instruction before FROM: {line}"
        stages[current].append(line)
    return stages


def _lineage(stages: dict[str, list[str]], name: str) -> list[str]:
    """All instructions that build stage ``name`` (following FROM <stage> parents)."""
    lines = stages[name]
    parent = re.match(r"FROM\s+(\S+)", lines[0], re.IGNORECASE).group(1)  # type: ignore[union-attr]
    return (_lineage(stages, parent) if parent in stages else []) + lines


def _compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_dockerfile_has_api_without_torch_and_worker_with_torch() -> None:
    stages = _stages()
    assert {"api", "worker"} <= set(stages)
    api_runs = " ".join(i for i in _lineage(stages, "api") if i.upper().startswith("RUN"))
    assert "torch" not in api_runs and "[worker" not in api_runs
    assert "-r requirements/server.txt" in api_runs and "worker.txt" not in api_runs
    worker_runs = " ".join(i for i in _lineage(stages, "worker") if i.upper().startswith("RUN"))
    assert ".[worker]" in worker_runs
    # the lock, torch with it, is installed before the project, which adds no dependency
    assert worker_runs.index("-r requirements/worker.txt") < worker_runs.index(".[worker]")
    locks = ROOT / "requirements"
    assert not re.search(r"^torch==", (locks / "server.txt").read_text(), re.MULTILINE)
    # the worker image: PyPI's torch (the CUDA build, no local label) and its CUDA wheels
    worker_lock = (locks / "worker.txt").read_text()
    assert re.search(r"^torch==2\.13\.0 \\$", worker_lock, re.MULTILINE)
    assert re.search(r"^nvidia-cudnn-cu\d+==", worker_lock, re.MULTILINE)


def _copies_and_runs(lines: list[str]) -> list[tuple[str, str]]:
    return [(i.split()[0].upper(), i) for i in lines if i.split()[0].upper() in ("COPY", "RUN")]


@pytest.mark.parametrize("stage", ["api", "worker"])
def test_dependencies_are_installed_before_the_source_is_copied(stage: str) -> None:
    lines = _lineage(_stages(), stage)
    steps = _copies_and_runs(lines)
    source_copies = [
        n for n, (op, i) in enumerate(steps) if op == "COPY" and re.search(r"\b(app|workers)\b", i)
    ]
    dep_installs = [
        n
        for n, (op, i) in enumerate(steps)
        if op == "RUN" and "pip install --require-hashes -r requirements/" in i
    ]
    project_installs = [
        (n, i)
        for n, (op, i) in enumerate(steps)
        if op == "RUN" and "pip install" in i and "'.[" in i
    ]
    assert dep_installs and source_copies and project_installs, steps
    assert max(dep_installs) < min(source_copies) < project_installs[-1][0]
    # The project install is not editable and adds no dependency the lock did not pin.
    install = project_installs[-1][1]
    assert " -e " not in install and "--editable" not in install and "--no-deps" in install
    # Each lock the image installs is copied by itself, before the source.
    lock_copies = [n for n, (op, i) in enumerate(steps) if op == "COPY" and "requirements/" in i]
    assert lock_copies and max(lock_copies) < min(dep_installs)


def test_the_locks_sources_are_the_extras_dependencies() -> None:
    import sys
    import tomllib

    sys.path.insert(0, str(ROOT / "scripts"))
    from lock import declared

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    server = declared(["server"])
    assert set(project["dependencies"]) <= set(server)
    assert set(project["optional-dependencies"]["server"]) <= set(server)
    worker = declared(["worker"])
    assert set(server) < set(worker) and any(d.startswith("torch") for d in worker)
    assert not any(d.startswith("curvplan") for d in worker)


def test_dockerignore_keeps_the_context_to_what_the_images_install() -> None:
    ignored = {
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".git", ".venv", "tests", "benchmarks"} <= ignored
    copied = set()
    for lines in _stages().values():
        for line in lines:
            if line.upper().startswith("COPY") and "--from" not in line:
                copied |= {p.rstrip("/").split("/")[0] for p in line.split()[1:-1]}
    assert copied and not copied & ignored, copied & ignored


def test_worker_image_has_a_healthcheck_on_its_heartbeat() -> None:
    worker = _lineage(_stages(), "worker")
    check = next(i for i in worker if i.upper().startswith("HEALTHCHECK"))
    command = yaml.safe_load(check.split(" CMD ", 1)[1])
    assert command[:2] == ["curvplan", "worker-health"]
    env = " ".join(i for i in worker if i.upper().startswith("ENV"))
    assert "CURVPLAN_WORKER_HEALTH_FILE=" in env
    result = CliRunner().invoke(cli, [*command[1:], "--help"])
    assert result.exit_code == 0, result.output


def test_worker_extra_is_the_only_torch_dependency() -> None:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not any(d.startswith("torch") for d in project["dependencies"])
    assert any(d.startswith("torch") for d in project["optional-dependencies"]["worker"])


def test_compose_services_and_gpu_reservation() -> None:
    services = _compose()["services"]
    assert {"postgres", "migrate", "api"} <= set(services)
    assert services["migrate"]["command"] == ["curvplan", "db", "upgrade"]
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert services["api"]["build"]["target"] == "api"
    assert services["api"]["depends_on"]["migrate"]["condition"] == (
        "service_completed_successfully"
    )
    gpu_workers = {
        name: svc
        for name, svc in services.items()
        if svc.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices")
    }
    assert gpu_workers, "no service reserves a GPU"
    seen_ids: set[str] = set()
    for name, svc in gpu_workers.items():
        assert svc["build"]["target"] == "worker", name
        devices = svc["deploy"]["resources"]["reservations"]["devices"]
        assert len(devices) == 1, "one worker service per GPU"
        device = devices[0]
        assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
        assert len(device["device_ids"]) == 1 and not seen_ids & set(device["device_ids"])
        seen_ids |= set(device["device_ids"])
        assert svc["command"][:2] == ["curvplan", "worker"]
        assert "gpu" in svc["command"][svc["command"].index("--queues") + 1].split(",")
    for name, svc in services.items():
        if name != "postgres":
            assert svc["environment"]["DATABASE_URL"].startswith("postgresql://"), name


def _named_commands() -> list[list[str]]:
    commands = [svc["command"] for svc in _compose()["services"].values() if "command" in svc]
    for lines in _stages().values():
        entrypoint: list[str] = []  # a stage's ENTRYPOINT comes before its CMD
        for line in lines:
            if line.upper().startswith("ENTRYPOINT"):
                entrypoint = yaml.safe_load(line[len("ENTRYPOINT") :].strip())
            if line.upper().startswith("CMD"):
                commands.append([*entrypoint, *yaml.safe_load(line[3:].strip())])
    return [c if isinstance(c, list) else shlex.split(c) for c in commands]


@pytest.mark.parametrize("command", _named_commands(), ids=lambda c: " ".join(c[:3]))
def test_named_commands_exist_in_the_cli(command: list[str]) -> None:
    assert command[0] == "curvplan"
    result = CliRunner().invoke(cli, [*command[1:], "--help"])
    assert result.exit_code == 0, result.output
