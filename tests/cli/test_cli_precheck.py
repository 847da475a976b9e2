"""The CLI validates a job body before it uploads anything: ``--option nonsense=1`` or
``--type bach`` exit 2 naming the field, and no upload was started (the client's
``upload_artifact`` records each call and stops there; nothing listens at the URL)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from analyze_files import write_analyze_files
from live_plugin import free_port
from typer.testing import CliRunner

import curvplan
from curvplan.cli import app

EXIT_BAD_INPUT = 2


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_analyze_files(tmp_path_factory.mktemp("precheck-files"))


@pytest.fixture
def uploads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    started: list[Path] = []

    def upload_artifact(self: Any, path: Path, kind: str) -> Any:
        started.append(Path(path))
        raise ValueError("upload started")  # exit 2 with this text

    monkeypatch.setattr(curvplan.Client, "upload_artifact", upload_artifact)
    return started


def _run(args: list[str]) -> Any:
    env = {"CURVPLAN_URL": f"http://127.0.0.1:{free_port()}", "CURVPLAN_API_KEY": "cp_none"}
    return CliRunner().invoke(app, args, env=env)


@pytest.mark.parametrize(
    ("option", "field"),
    [
        ("nonsense=1", "body.options.nonsense"),
        ("tolerance=2", "body.options.tolerance"),
        ("perturbation_radius=1e999", "body.options.perturbation_radius"),
    ],
)
def test_analyze_refuses_bad_options_before_uploading(
    files: dict[str, Path], uploads: list[Path], option: str, field: str
) -> None:
    run = _run(
        ["analyze", "--spec", str(files["spec"]), "--checkpoint", str(files["checkpoint"]),
         "--data", str(files["data"]), "--option", option]
    )  # fmt: skip
    assert run.exit_code == EXIT_BAD_INPUT, run.output
    assert field in run.output and uploads == []


@pytest.mark.parametrize(
    ("flags", "field"),
    [
        (["--type", "bach"], "body.sweep.type"),
        (["--target-loss", "2", "--batch-sizes", "8,16"], "body.sweep.batch_sizes"),
    ],
)
def test_sweep_refuses_bad_flags_before_uploading(
    files: dict[str, Path], uploads: list[Path], flags: list[str], field: str
) -> None:
    run = _run(
        ["sweep", "--spec", str(files["spec"]), "--train", str(files["data"]),
         "--eval", str(files["data"]), *flags]
    )  # fmt: skip
    assert run.exit_code == EXIT_BAD_INPUT, run.output
    assert field in run.output and uploads == []


@pytest.mark.parametrize("command", ["analyze", "sweep"])
def test_a_valid_body_goes_on_to_the_upload(
    files: dict[str, Path], uploads: list[Path], command: str
) -> None:
    """The oracle of the tests above: a body that passes reaches the uploads."""
    args = (
        ["analyze", "--spec", str(files["spec"]), "--checkpoint", str(files["checkpoint"]),
         "--data", str(files["data"]), "--option", "tolerance=0.01"]
        if command == "analyze"
        else ["sweep", "--spec", str(files["spec"]), "--train", str(files["data"]),
              "--eval", str(files["data"]), "--target-loss", "2"]
    )  # fmt: skip
    run = _run(args)
    assert run.exit_code == EXIT_BAD_INPUT and "upload started" in run.output, run.output
    assert len(uploads) == 1
