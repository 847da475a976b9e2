"""A real Hugging Face Trainer output folder, written once per session by the code of
``curvplan example --arch gpt2`` (transformers' ``Trainer``, offline, from a config; a few
seconds of CPU), and the CLI helpers (tests/cli)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))

RUN_STEPS = 300
SAVE_STEPS = 50


@pytest.fixture(scope="session")
def trainer_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """``(run folder, summary)``: a tiny GPT-2 trained ``RUN_STEPS`` steps by the Trainer,
    ``checkpoint-<n>`` every ``SAVE_STEPS``; the summary holds the Trainer's own in-memory
    ``log_history`` (the oracle for what the parser reads back from the files)."""
    from curvplan_worker.curvature.hf_example import write_hf_example

    out = tmp_path_factory.mktemp("trainer-run") / "gpt2"
    summary = write_hf_example(out, "gpt2", steps=RUN_STEPS, save_steps=SAVE_STEPS)
    assert json.loads((out / "example.json").read_text())["log_history"] == summary["log_history"]
    return out, summary
