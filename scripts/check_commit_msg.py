"""commit-msg hook: a subject of at most 72 characters, and a blank line before any body.

``pre-commit`` runs it with the message file's path (``.pre-commit-config.yaml``); it
prints what is wrong and exits 1, or exits 0. Comment lines (``#``) are git's, not the
message's.
"""

from __future__ import annotations

import sys
from pathlib import Path

MAX_SUBJECT = 72


def problems(message: str) -> list[str]:
    """What is wrong with a commit message (empty when nothing is)."""
    lines = [line for line in message.splitlines() if not line.startswith("#")]
    while lines and not lines[0].strip():
        lines.pop(0)
    if not lines:
        return ["the message is empty"]
    found = []
    if len(lines[0]) > MAX_SUBJECT:
        found.append(f"the subject is {len(lines[0])} characters; at most {MAX_SUBJECT}")
    if len(lines) > 1 and lines[1].strip():
        found.append("leave a blank line between the subject and the body")
    return found


def main(argv: list[str]) -> int:
    found = problems(Path(argv[1]).read_text(encoding="utf-8"))
    for problem in found:
        print(f"commit message: {problem}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
