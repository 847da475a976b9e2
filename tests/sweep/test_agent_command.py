"""``curvplan agent``'s client side without a service: the command template (unknown placeholders
refused before anything runs), the key check, and one point's run against a fake heartbeat —
a failing command's last 20 stderr lines, cancel (SIGTERM, then SIGKILL), the time limit, a
lost lease, the loss protocol on stdout and in the loss file."""

from __future__ import annotations

import subprocess
import sys
import threading
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from curvplan.agent.run import Outcome, run_point
from curvplan.agent.template import TemplateError, check_template, point_values, render
from curvplan.client.errors import ConflictError
from curvplan.types.agents import AgentHeartbeatOut, AgentJob, AgentProgress
from curvplan.types.sweep import OptimizerSpec, PointSettings

POINT = PointSettings(
    type="batch", batch_size=8, lr=0.01, target_loss=0.5, max_steps=100, eval_every=10
)


def _job(time_limit: float = 60.0) -> AgentJob:
    return AgentJob(
        job_id=uuid.uuid4(),
        attempt=1,
        max_attempts=3,
        name="B=8",
        sweep_id=uuid.uuid4(),
        point=POINT,
        optimizer=OptimizerSpec(),
        time_limit_seconds=time_limit,
        lease_expires_at=datetime.now(UTC),
    )


class FakeAPI:
    """Beats at once and often; answers cancel or a lost lease after ``after`` beats."""

    heartbeat_seconds = 0.05

    def __init__(self, cancel_after: int | None = None, lose_after: int | None = None) -> None:
        self.beats: list[AgentProgress | None] = []
        self.cancel_after, self.lose_after = cancel_after, lose_after

    def heartbeat(self, job: AgentJob, progress: AgentProgress | None) -> AgentHeartbeatOut:
        self.beats.append(progress)
        if self.lose_after is not None and len(self.beats) > self.lose_after:
            raise ConflictError("lease lost", status=409)
        cancel = self.cancel_after is not None and len(self.beats) > self.cancel_after
        return AgentHeartbeatOut(status="running", cancel_requested=cancel, lease_seconds=2.0)


def _run(code: str, tmp_path: Path, api: FakeAPI | None = None, **kw: Any) -> Outcome:
    return run_point(
        api or FakeAPI(),
        kw.pop("job", None) or _job(),
        [sys.executable, "-c", code],
        tmp_path / "out",
        stopping=kw.pop("stopping", threading.Event()),
        cancel_grace=kw.pop("cancel_grace", 5.0),
        log=lambda message: None,
        poll=0.02,
    )


def test_an_unknown_placeholder_is_refused_naming_it() -> None:
    with pytest.raises(TemplateError, match=r"\{batchsize\}.*known ones are \{batch_size\}"):
        check_template("python train.py --batch-size {batchsize} --lr {lr}", {})
    with pytest.raises(TemplateError, match=r"\{colour\}"):
        check_template("python train.py", {"colour": "red"})
    check_template("python train.py --lr {lr:.3g} --out {output_dir}", {"data_size": "0"})


def test_each_word_is_formatted_and_a_missing_value_needs_a_default(tmp_path: Path) -> None:
    values = point_values(_job(), tmp_path / "my runs")
    template = "python train.py --out {output_dir} --max-examples {data_size} --lr {lr:.2e}"
    with pytest.raises(TemplateError, match=r"\{data_size\}.*--default data_size=VALUE"):
        render(template, values, {})
    argv = render(template, values, {"data_size": "0"})
    assert argv == [
        "python", "train.py", "--out", str(tmp_path / "my runs"), "--max-examples", "0",
        "--lr", "1.00e-02",
    ]  # fmt: skip


def test_the_cli_refuses_a_bad_template_and_a_missing_key_before_anything_runs() -> None:
    dead = "http://127.0.0.1:9"  # nothing listens: any request would fail to connect
    cli = [sys.executable, "-m", "curvplan.cli", "agent", "--url", dead]
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp"}
    bad = subprocess.run(
        [*cli, "--api-key", "cp_x", "--command", "python t.py {batch} {lr}"],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert bad.returncode == 2 and "unknown placeholder(s) {batch}" in bad.stderr, bad.stderr
    keyless = subprocess.run(
        [*cli, "--command", "python t.py {lr}"], capture_output=True, text=True, env=env, timeout=60
    )
    assert keyless.returncode == 2, keyless.stderr
    assert "needs the API key of the project" in keyless.stderr
    sweep = [sys.executable, "-m", "curvplan.cli", "sweep", "--url", dead, "--api-key", "cp_x"]
    with_data = subprocess.run(
        [*sweep, "--runner", "agent", "--train", "t.safetensors", "--target-loss", "1"],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert with_data.returncode == 2 and "--train: an agent sweep trains" in with_data.stderr


def test_a_failing_command_fails_the_point_with_its_last_20_stderr_lines(tmp_path: Path) -> None:
    code = "import sys\nfor i in range(25): print(f'err line {i}', file=sys.stderr)\nsys.exit(3)"
    outcome = _run(code, tmp_path)
    assert (outcome.ended, outcome.error_type) == ("failed", "command-failed")
    assert "exited with status 3" in outcome.detail
    assert "err line 24" in outcome.detail and "err line 5" in outcome.detail
    assert "err line 4\n" not in outcome.detail  # only the last 20


def test_losses_on_stdout_and_in_the_loss_file_are_both_read(tmp_path: Path) -> None:
    code = (
        "import json, os\n"
        "print(json.dumps({'step': 0, 'loss': 2.0}))\n"
        "print('plain output is passed through')\n"
        "open(os.environ['CURVPLAN_LOSS_FILE'], 'a').write(json.dumps({'step': 10, 'loss': 1.0})"
        " + '\\n')\n"
        "assert 'CURVPLAN_API_KEY' not in os.environ\n"
    )
    outcome = _run(code, tmp_path)
    assert outcome.ended == "succeeded", outcome
    assert sorted((r.step, r.loss) for r in outcome.records) == [(0, 2.0), (10, 1.0)]
    nan = _run('print(\'{"step": 5, "loss": NaN}\')', tmp_path)
    assert (nan.ended, nan.error_type) == ("failed", "diverged")
    silent = _run("pass", tmp_path)
    assert (silent.ended, silent.error_type) == ("failed", "no-losses")


SLEEPER = 'import time\nprint(\'{"step": 1, "loss": 1.0}\', flush=True)\ntime.sleep(60)'
STUBBORN = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n" + SLEEPER


def test_a_cancel_stops_the_command_with_sigterm_then_sigkill(tmp_path: Path) -> None:
    api = FakeAPI(cancel_after=2)
    outcome = _run(STUBBORN, tmp_path, api, cancel_grace=0.5)
    assert outcome.ended == "cancelled" and outcome.seconds < 30
    assert any(b and b.message == "step 1, eval loss 1" for b in api.beats), api.beats


def test_the_time_limit_and_a_lost_lease_stop_the_command(tmp_path: Path) -> None:
    timed = _run(SLEEPER, tmp_path, job=_job(time_limit=0.5))
    assert (timed.ended, timed.error_type) == ("failed", "timeout") and timed.seconds < 30
    lost = _run(SLEEPER, tmp_path, FakeAPI(lose_after=1))
    assert lost.ended == "lost" and lost.seconds < 30
    stopping = threading.Event()
    stopping.set()
    released = _run(SLEEPER, tmp_path, stopping=stopping)
    assert released.ended == "released"
