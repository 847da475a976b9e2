"""Run the ``curvplan`` CLI in a subprocess: through a pipe, or in a pseudo-terminal."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from dataclasses import dataclass

CLI = [sys.executable, "-m", "curvplan.cli"]


@dataclass
class Run:
    code: int
    stdout: str
    stderr: str


def run_cli(args: list[str], env: dict[str, str], timeout: float = 120, **kw: object) -> Run:
    out = subprocess.run(
        [*CLI, *args], env=env, capture_output=True, text=True, timeout=timeout, **kw
    )
    return Run(out.returncode, out.stdout, out.stderr)


def run_cli_in_pty(args: list[str], env: dict[str, str], timeout: float = 120) -> Run:
    """Run with stdout and stderr on a pseudo-terminal; ``stdout`` holds everything it drew."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [*CLI, *args],
        env={**env, "TERM": "xterm", "COLUMNS": "120"},
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=slave,
        close_fds=True,
    )
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    return Run(code, b"".join(chunks).decode("utf-8", "replace"), "")
