"""Print the dependencies of the base install plus extras, one per line (no project code).

The Dockerfile installs these before it copies the source, so a code change does not
re-install the dependencies (build cache). Reads pyproject.toml only; ``curvplan[...]``
self-references are expanded.

    python scripts/docker_requirements.py server worker
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def requirements(extras: list[str]) -> list[str]:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    optional = project.get("optional-dependencies", {})
    out: list[str] = list(project["dependencies"])
    todo, seen = list(extras), set()
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for dep in optional[extra]:
            self_ref = re.fullmatch(r"curvplan\[([\w,\s-]+)\]", dep.replace(" ", ""))
            if self_ref:
                todo += self_ref.group(1).split(",")
            else:
                out.append(dep)
    return sorted(dict.fromkeys(out))


if __name__ == "__main__":
    print("\n".join(requirements(sys.argv[1:])))
