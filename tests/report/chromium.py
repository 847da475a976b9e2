"""Drive Debian's Chromium headless: screenshots, the rendered DOM and console messages."""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import tempfile
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

CHROMIUM = os.environ.get("CURVPLAN_CHROMIUM", "/usr/bin/chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
    "--enable-logging=stderr",
    "--v=0",
]
CONSOLE_LINE = re.compile(r":CONSOLE(?:\(\d+\)|:\d+)\] (.*)")


def find_chromium() -> str | None:
    """The browser binary, or None. The set-up installs it (``make install`` runs
    scripts/ensure_chromium.sh); the tests never install anything themselves."""
    return CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")


@dataclass
class BrowserRun:
    stdout: str
    console: list[str]  # every console message the page produced


def run_chromium(binary: str, url: str, *extra: str, timeout: float = 90) -> BrowserRun:
    with tempfile.TemporaryDirectory(prefix="curvplan-chromium-") as profile:
        out = subprocess.run(
            [binary, *FLAGS, f"--user-data-dir={profile}", *extra, url],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    console = [m.group(1) for m in map(CONSOLE_LINE.search, out.stderr.splitlines()) if m]
    return BrowserRun(out.stdout, console)


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk; raises if the file is not a PNG."""
    head = path.read_bytes()[:24]
    if head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        raise ValueError(f"{path} is not a PNG")
    return struct.unpack(">II", head[16:24])


class SvgCensus(HTMLParser):
    """Counts drawing elements inside each ``<svg id=…>``, and notes any active content."""

    DRAWN = frozenset({"circle", "polyline", "polygon", "rect", "line", "path", "text"})
    ACTIVE = frozenset({"script", "iframe", "object", "embed", "link", "img"})

    def __init__(self) -> None:
        super().__init__()
        self.svgs: dict[str, int] = {}
        self.active: list[str] = []
        self.empty_notes: list[str] = []
        self._stack: list[str] = []
        self._in_empty = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "svg":
            self._stack.append(a.get("id") or f"anonymous-{len(self.svgs)}")
            self.svgs.setdefault(self._stack[-1], 0)
        elif self._stack and tag in self.DRAWN:
            self.svgs[self._stack[-1]] += 1
        if tag in self.ACTIVE:
            self.active.append(tag)
        if tag == "p" and a.get("class") == "empty":
            self._in_empty = True
            self.empty_notes.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == "svg" and self._stack:
            self._stack.pop()
        if tag == "p":
            self._in_empty = False

    def handle_data(self, data: str) -> None:
        if self._in_empty:
            self.empty_notes[-1] += data
