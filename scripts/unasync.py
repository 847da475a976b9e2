"""Generate the synchronous client ``curvplan/client/sync.py`` from the asynchronous one.

    python scripts/unasync.py           # rewrite sync.py (what `make unasync` runs)
    python scripts/unasync.py --check   # exit 1 with a diff when sync.py is stale

``curvplan/client/aio.py`` is the one implementation; ``sync.py`` is derived from it by
token rewriting (``async def`` → ``def``, ``await`` dropped, ``asyncio.sleep`` →
``time.sleep``, …) and ``ruff format``, in the manner of the ``unasync`` tool. Every rule
must apply at least once, so a rule that no longer matches after an edit of ``aio.py``
fails loudly instead of leaving async code in the sync client. Edit ``aio.py``, never
``sync.py``; a test checks that the copy is current.

Why not the ``unasync`` package itself: it renames single name tokens (``async``/``await``,
``__aenter__``, ``AsyncIterator``, names you add) and nothing else. Run on ``aio.py`` it
leaves ``asyncio.sleep(…)`` (a coroutine never awaited: the retry loop would not wait),
``asyncio.to_thread(f, …)`` (a coroutine unpacked as the upload's result), the coroutine
check of the progress callback, ``Awaitable`` in the callback's type and the docstrings that
say "async"; those are 11 of the 19 rules below, so it would add a dependency and keep the
regexes. It also writes files by directory (``_async/`` → ``_sync/``) and has no string
output for ``--check``.
"""

from __future__ import annotations

import argparse
import difflib
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "curvplan" / "client" / "aio.py"
TARGET = ROOT / "curvplan" / "client" / "sync.py"

HEADER = (
    "# Generated from curvplan/client/aio.py by scripts/unasync.py: do not edit by hand\n"
    "# (edit aio.py, then run `make unasync`).\n"
)

#: (pattern, replacement), applied in order; each must match at least once.
RULES: list[tuple[str, str]] = [
    # Texts that say "async" in words.
    (
        r'"""The asynchronous client: :class:`AsyncClient` \(same methods as :class:`Client`, '
        r'awaited\)\."""',
        '"""The synchronous client: :class:`Client` (generated from the asynchronous one)."""',
    ),
    (
        r"Talk to a curvplan service from asyncio \(like :class:`Client`, every method awaited\)\.",
        "Talk to a curvplan service (synchronous; thread-safe like ``httpx.Client``).",
    ),
    (
        r"Use as an async context manager or await :meth:`aclose`\.",
        "Use as a context manager or call :meth:`close`.",
    ),
    # A progress callback may be a coroutine function in the async client only.
    (
        r"(?m)^(\s*)outcome = on_progress\(job\)\n\1if asyncio\.iscoroutine\(outcome\):\n"
        r"\s*await outcome\n",
        r"\1on_progress(job)\n",
    ),
    (r"Callable\[\[m\.JobOut\], Awaitable\[None\] \| None\]", "Callable[[m.JobOut], None]"),
    # Async generators cannot `yield from`; the sync one can.
    (r"(?m)^(\s*)for (\w+) in ([\w.]+):\n\s*yield \2\n", r"\1yield from \3\n"),
    # Comments about the event loop only.
    (r"(?m)^\s*# async only: .*\n", ""),
    # Work moved off the event loop runs inline.
    (r"await asyncio\.to_thread\(([\w.]+), ", r"\1("),
    # Names.
    (r"__aenter__", "__enter__"),
    (r"__aexit__", "__exit__"),
    (r"\baclose\b", "close"),
    (r"\bAsyncClient\b", "Client"),
    (r"httpx\.AsyncBaseTransport", "httpx.BaseTransport"),
    (r"\bAsyncIterator\b", "Iterator"),
    (r", Awaitable,", ","),
    (r"asyncio\.sleep\(", "time.sleep("),
    (r"\basync def ", "def "),
    (r"\bawait ", ""),
    (r"(?m)^import asyncio\n", ""),
]


def _ruff() -> str:
    found = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if found is None:
        raise SystemExit("ruff is needed to format the generated client (pip install ruff)")
    return found


def render() -> str:
    """sync.py as generated from the current aio.py."""
    text = SOURCE.read_text()
    for pattern, replacement in RULES:
        text, count = re.subn(pattern, replacement, text)
        if count == 0:
            raise SystemExit(f"unasync rule {pattern!r} no longer matches curvplan/client/aio.py")
    if re.search(r"\basync\b|\bawait\b|asyncio", text):
        raise SystemExit("unasync left async code in the sync client: add a rule")
    for command in (["check", "--select", "I", "--fix", "--quiet"], ["format"]):
        text = subprocess.run(
            [_ruff(), *command, "--stdin-filename", str(TARGET), "-"],
            input=text,
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
        ).stdout
    return HEADER + text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args()
    generated = render()
    if not args.check:
        TARGET.write_text(generated)
        print(f"wrote {TARGET.relative_to(ROOT)}")
        return 0
    current = TARGET.read_text() if TARGET.exists() else ""
    if current == generated:
        return 0
    diff = difflib.unified_diff(
        current.splitlines(), generated.splitlines(), str(TARGET), "generated", lineterm=""
    )
    print("\n".join(list(diff)[:200]))
    print("curvplan/client/sync.py is stale: run `make unasync` and commit it.", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
