"""The pipeline step: the client-only image, the GitHub Action and its script, the Airflow
and Argo examples. No Docker, Airflow or Argo here: the files are parsed, and every command
line they run is run with the server's dependencies made unimportable (as in the image)."""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "tests" / "client"))

from test_deploy_files import _lineage, _stages  # noqa: E402

# What the client image does not have: importing any of these fails there, and here too
# when the command runs with CLIENT_ONLY's sitecustomize.
SERVER_ONLY = ("fastapi", "starlette", "uvicorn", "sqlalchemy", "psycopg", "alembic", "numpy",
               "scipy", "matplotlib", "torch", "safetensors", "curvplan_core",
               "curvplan_server", "curvplan_worker", "mlflow")  # fmt: skip
BLOCKER = f"""
import sys
class _NotInTheClientImage:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {SERVER_ONLY!r}:
            raise ImportError(name + " is not installed in the client image")
sys.meta_path.insert(0, _NotInTheClientImage())
"""
STEP_OUTPUTS = {"job_id", "status", "kind", "samples", "samples_lo", "samples_hi",
                "samples_tokens", "available_samples", "landscape_stabilisation", "target_loss",
                "batch_size", "batch_size_tokens", "critical_batch_size",
                "critical_batch_size_lo", "critical_batch_size_hi", "expected_steps",
                "gd_sharpness_threshold", "evaluation_set_size", "report",
                "result"}  # fmt: skip


@pytest.fixture(scope="module")
def client_only(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """An environment whose Python cannot import the server's or the worker's dependencies."""
    folder = tmp_path_factory.mktemp("client-only")
    (folder / "sitecustomize.py").write_text(BLOCKER)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CURVPLAN_", "MLFLOW_"))}
    env["PYTHONPATH"] = str(folder)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def _cli(args: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["curvplan", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


def test_client_stage_installs_the_client_only() -> None:
    stages = _stages()
    client = _lineage(stages, "client")
    assert client[0].startswith("FROM python:3.11-slim")  # not the server's base stage
    runs = " ".join(i for i in client if i.upper().startswith("RUN"))
    # The base install's (and CLIENT_EXTRAS') locked dependencies first, then the project alone.
    assert '--require-hashes -r "requirements/${CLIENT_EXTRAS:-base}.txt"' in runs
    assert "pip install --no-deps ." in runs
    sys.path.insert(0, str(ROOT / "scripts"))
    from lock import LOCKS, declared

    assert LOCKS["base"].extras == () and LOCKS["mlflow"].extras == ("mlflow",)
    client_deps = {"pydantic", "httpx", "typer", "rich"}
    assert {re.split(r"[<>=\[ ]", d)[0] for d in declared([])} == client_deps
    assert "torch" not in runs and "[server" not in runs and "[worker" not in runs
    assert 'ENTRYPOINT ["curvplan"]' in client and 'CMD ["--help"]' in client
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = {re.split(r"[<>=\[ ]", d)[0] for d in project["dependencies"]}
    assert base == client_deps
    extras = project["optional-dependencies"]
    assert any(d.startswith("matplotlib") for d in extras["server"])  # drawn by the API only
    assert [d.split(">")[0] for d in extras["mlflow"]] == ["mlflow-skinny"]
    assert any(d.startswith("mlflow>") for d in extras["dev"])  # the tracking server in tests


def test_image_command_lines_parse_without_server_dependencies(
    client_only: dict[str, str],
) -> None:
    """The image's default command, and the example steps' exact argument lists: every
    option parses (the command stops at the first missing input file, not at an option)."""
    assert "not installed in the client image" in _cli(["serve"], client_only).stderr  # control
    assert _cli(["--help"], client_only).returncode == 0  # CMD ["--help"]
    dag = ast.parse((ROOT / "examples/pipelines/airflow_dag.py").read_text())
    # the DAG's constants only (Airflow is not installed here): PILOT and ANALYZE
    names: dict[str, object] = {}
    for node in dag.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") in (
            "PILOT",
            "ANALYZE",
        ):
            exec(compile(ast.Module([node], []), "airflow_dag.py", "exec"), names)
    analyze = names["ANALYZE"]
    assert isinstance(analyze, list)
    workflow = yaml.safe_load((ROOT / "examples/pipelines/argo_workflow.yaml").read_text())
    (step,) = [t for t in workflow["spec"]["templates"] if t["name"] == "curvplan-analyze"]
    assert step["container"]["image"] == "curvplan-client:latest"
    argo = shlex.split(step["container"]["args"][0].split(">")[0])
    for args in (analyze, argo):
        assert args[:2] == ["curvplan", "analyze"] and {"--wait", "--json"} <= set(args)
        run = _cli(args[1:], client_only)
        assert run.returncode == 2 and "--spec: cannot read /pilot/spec.json" in run.stderr


def test_action_outputs_come_from_the_step_script() -> None:
    action = yaml.safe_load((ROOT / "action.yml").read_text())
    assert action["runs"]["using"] == "composite"
    steps = action["runs"]["steps"]
    (step,) = [s for s in steps if s.get("id") == "curvplan"]
    assert "scripts/pipeline_step.sh" in step["run"]
    for name, output in action["outputs"].items():
        key = re.fullmatch(r"\$\{\{ steps\.curvplan\.outputs\.(\w+) \}\}", output["value"])
        assert key and key.group(1) in STEP_OUTPUTS, name
    script = (ROOT / "scripts/pipeline_step.sh").read_text()
    used = set(re.findall(r"CURVPLAN_STEP_[A-Z]+", script)) - {"CURVPLAN_STEP_CLI"}
    assert used == {k for k in step["env"] if k.startswith("CURVPLAN_STEP_")}


def test_action_inputs_become_the_cli_flags(tmp_path: Path) -> None:
    """Each input reaches the CLI as its flag (a stand-in CLI records its argument list):
    `model` replaces spec/checkpoint, and `intermediate`/`sweep` give one flag a line."""
    record = tmp_path / "argv.json"
    fake = tmp_path / "fake-curvplan"
    fake.write_text(f"#!{sys.executable}\nimport json, sys\n"
                    f"json.dump(sys.argv[1:], open({str(record)!r}, 'w'))\n")  # fmt: skip
    fake.chmod(0o755)
    base = {"PATH": os.environ["PATH"], "GITHUB_OUTPUT": str(tmp_path / "out"),
            "CURVPLAN_STEP_CLI": str(fake)}  # fmt: skip
    step = {"CURVPLAN_STEP_MODEL": "run/checkpoint-300", "CURVPLAN_STEP_DATA": "data.safetensors",
            "CURVPLAN_STEP_INTERMEDIATE": "run/checkpoint-100\n\nrun/checkpoint-200\n",
            "CURVPLAN_STEP_SWEEP": "batch-sweep\n",
            "CURVPLAN_STEP_OPTIONS": "max_iter=5"}  # fmt: skip
    run = subprocess.run(["bash", str(ROOT / "scripts/pipeline_step.sh")], env={**base, **step},
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert run.returncode == 0, run.stderr
    argv = json.loads(record.read_text())
    assert argv[:5] == ["analyze", "--model", "run/checkpoint-300", "--data", "data.safetensors"]
    flags = list(zip(argv[5::2], argv[6::2], strict=False))
    assert ("--intermediate", "run/checkpoint-100") in flags
    assert ("--intermediate", "run/checkpoint-200") in flags
    assert ("--sweep", "batch-sweep") in flags and ("--option", "max_iter=5") in flags
    assert "--spec" not in argv and argv.count("--intermediate") == 2
    both = subprocess.run(["bash", str(ROOT / "scripts/pipeline_step.sh")],
                          env={**base, **step, "CURVPLAN_STEP_SPEC": "spec.json"},
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert both.returncode == 2 and "'model'" in both.stderr


@pytest.mark.e2e
def test_action_script_against_a_real_server(
    live: object, client_only: dict[str, str], tmp_path: Path
) -> None:
    from analyze_files import SPEC, write_analyze_files
    from plan_bodies import B_CRIT, full_measurements, full_targets

    env = {**client_only, "CURVPLAN_URL": live.url, "CURVPLAN_API_KEY": live.api_key,  # type: ignore[attr-defined]
           "RUNNER_TEMP": str(tmp_path)}  # fmt: skip
    body = tmp_path / "plan.json"
    body.write_text(json.dumps({"measurements": full_measurements(), "targets": full_targets()}))
    outputs = tmp_path / "github_output"
    ok = subprocess.run(
        ["bash", str(ROOT / "scripts/pipeline_step.sh")],
        env={**env, "GITHUB_OUTPUT": str(outputs), "CURVPLAN_STEP_MEASUREMENTS": str(body),
             "CURVPLAN_STEP_NAME": "ci-budget", "CURVPLAN_STEP_TIMEOUT": "120"},
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    got = dict(line.split("=", 1) for line in outputs.read_text().splitlines())
    assert set(got) <= STEP_OUTPUTS and got["status"] == "succeeded"
    job = json.loads(Path(got["result"]).read_text())
    assert job["id"] == got["job_id"] and job["name"] == "ci-budget"
    rec = job["result"]["recommendation"]
    assert int(got["batch_size"]) == rec["budget"]["batch"]["recommended"]
    assert float(got["critical_batch_size"]) == pytest.approx(B_CRIT, rel=1e-3)
    assert int(got["samples"]) == rec["budget"]["data"]["recommended_examples"]
    assert got["report"].endswith(f"/v1/jobs/{job['id']}/report")

    files = write_analyze_files(tmp_path / "files")  # a checkpoint that does not fit the spec
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC))
    failed_outputs = tmp_path / "github_output_failed"
    failed = subprocess.run(
        ["bash", str(ROOT / "scripts/pipeline_step.sh")],
        env={**env, "GITHUB_OUTPUT": str(failed_outputs), "CURVPLAN_STEP_SPEC": str(spec),
             "CURVPLAN_STEP_CHECKPOINT": str(files["wider"]),
             "CURVPLAN_STEP_DATA": str(files["data"]), "CURVPLAN_STEP_TIMEOUT": "120",
             "CURVPLAN_STEP_OPTIONS": 'precision="float64"\nmax_iter=5'},
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert failed.returncode == 1, failed.stderr  # the step fails with the job
    assert "::error::the curvplan job failed" in failed.stderr
    got = dict(line.split("=", 1) for line in failed_outputs.read_text().splitlines())
    assert got["status"] == "failed" and "batch_size" not in got
