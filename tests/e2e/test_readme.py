"""Every README code block runs as written.

The README's fenced blocks are ``bash``, ``python`` or ``text`` (output, diagrams). A block the
test cannot run is marked in the README, on the line before its fence, with
``<!-- not-run: why -->``; the list of those is asserted here, so it stays short and named.
The fast test checks the labels, that every shell block parses and that no Python block
uses a name it does not define (``NameError: spec`` was one); the slow one runs every other
block, in README order, in one working directory, against the live service (a project of
its own), with only what a reader has after ``make run``: ``CURVPLAN_URL`` and
``CURVPLAN_API_KEY`` exported, ``curvplan`` on the PATH. It runs every default analysis and
sweep the README shows, so it is opt-in (``CURVPLAN_README_RUN=1``): 2115 s on the shared
2-core machine under load 15-38 (2026-12-01), far over the suite's budget.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from live_plugin import LiveService, make_api_key

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
VENV_BIN = Path(sys.executable).parent
FENCE = re.compile(
    r"(?:<!--\s*not-run:\s*(?P<reason>[^\n]*?)\s*-->\n)?^```(?P<lang>[a-z]*)\n(?P<body>.*?)^```$",
    re.S | re.M,
)
#: (language, the start of the reason) of every block the test does not run.
NOT_RUN = [
    ("bash", "starts the service / runs the whole suite"),
    ("bash", "the key is yours"),
    ("bash", "needs the repository's examples/"),
]


@dataclass
class Block:
    line: int
    lang: str
    body: str
    not_run: str | None


def readme_blocks() -> list[Block]:
    text = README.read_text()
    return [
        Block(text.count("\n", 0, m.start("body")) + 1, m["lang"], m["body"], m["reason"])
        for m in FENCE.finditer(text)
    ]


def test_readme_blocks_are_labelled_parse_and_define_their_names() -> None:
    blocks = readme_blocks()
    fences = sum(1 for line in README.read_text().splitlines() if line.startswith("```"))
    assert fences == 2 * len(blocks)  # every fence pair was found
    assert {b.lang for b in blocks} <= {"bash", "python", "text"}, [
        (b.line, b.lang) for b in blocks if b.lang not in ("bash", "python", "text")
    ]
    skipped = [(b.lang, b.not_run) for b in blocks if b.not_run is not None]
    assert len(skipped) == len(NOT_RUN)
    for (lang, reason), (want_lang, want) in zip(skipped, NOT_RUN, strict=True):
        assert lang == want_lang and reason is not None and reason.startswith(want), reason
    for b in blocks:
        if b.lang == "text":  # output and diagrams, never a command hidden from the test
            assert not re.search(r"^\s*(\$ |curvplan |curl |python)", b.body, re.M), b.line
        elif b.lang == "bash":
            parsed = subprocess.run(["bash", "-n"], input=b.body, text=True, capture_output=True)
            assert parsed.returncode == 0, (b.line, parsed.stderr)
        else:
            compile(b.body, f"README.md:{b.line}", "exec")
            undefined = subprocess.run(
                [str(VENV_BIN / "ruff"), "check", "--isolated", "--select", "F821,F401",
                 "--stdin-filename", f"README_{b.line}.py", "-"],
                input=b.body, text=True, capture_output=True,
            )  # fmt: skip
            assert undefined.returncode == 0, (b.line, undefined.stdout)


RUN_README = os.environ.get("CURVPLAN_README_RUN") == "1"


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.skipif(
    not RUN_README,
    reason="runs every README command (five default analyses, four sweeps): 35 min on the "
    "shared 2-core machine, over the suite's budget; set CURVPLAN_README_RUN=1 to run it",
)
def test_every_readme_block_runs_as_written(live: LiveService, tmp_path: Path) -> None:
    key = make_api_key(live.database_url, f"readme-{uuid.uuid4().hex[:8]}")
    env = live.client_env(
        CURVPLAN_API_KEY=key,
        PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        BROWSER="true",  # `report --open` opens "a browser" that exits at once
    )
    outputs: dict[int, tuple[str, str]] = {}
    timings: list[str] = []
    for block in readme_blocks():
        if block.not_run is not None or block.lang == "text":
            continue
        command = (
            ["bash", "-euo", "pipefail", "-c", block.body]
            if block.lang == "bash"
            else [sys.executable, "-c", block.body]
        )
        started = time.monotonic()
        run = subprocess.run(
            command, cwd=tmp_path, env=env, text=True, capture_output=True, timeout=1800
        )
        timings.append(f"README.md:{block.line} {block.lang} {time.monotonic() - started:.0f} s")
        assert run.returncode == 0, (
            f"README.md:{block.line} ({block.lang}) exited {run.returncode}\n"
            f"{run.stdout[-3000:]}\n{run.stderr[-3000:]}\n{live.logs()}"
        )
        outputs[block.line] = (block.body, run.stdout)
    print("\n".join(timings))
    # The Hugging Face path ends with a batch size and a data number, both from its sweeps.
    (hf_path,) = [out for body, out in outputs.values() if "sweep --model gpt2" in body]
    assert re.search(r"^data \(examples\)\s+[\d,]+\s.*data_sweep · loss 1\.4", hf_path, re.M), (
        hf_path
    )
    assert re.search(r"^batch \(examples\)\s+\d+\s.*batch_sweep · loss 1\.6", hf_path, re.M), (
        hf_path
    )
