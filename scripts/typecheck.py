"""Run mypy on the installed package names (``make lint`` runs this).

mypy does not follow setuptools' editable-install finders, so ``curvplan_server`` and
``curvplan_worker`` (the folders ``app/`` and ``workers/``, mapped by setup.py) are not
found by name. This script generates ``.typecheck/``, a tree of links named like the
installed packages (``curvplan_server → ../app``, ``curvplan_worker → ../workers``,
``curvplan → ../curvplan``), and runs mypy there with the settings of pyproject.toml
(``mypy_path = ".typecheck"``). The tree is derived from setup.py's LAYOUT and is ignored
by git.

    python scripts/typecheck.py [extra mypy arguments]
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / ".typecheck"
LAYOUT = {"curvplan": "curvplan", "curvplan_server": "app", "curvplan_worker": "workers"}


def link_tree() -> None:
    TREE.mkdir(exist_ok=True)
    for name, folder in LAYOUT.items():
        link = TREE / name
        target = Path("..") / folder
        if link.is_symlink() and Path(os.readlink(link)) == target:
            continue
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target, target_is_directory=True)


def main() -> int:
    link_tree()
    args = ["--config-file", str(ROOT / "pyproject.toml")]
    for name in LAYOUT:
        args += ["-p", name]
    return subprocess.call([sys.executable, "-m", "mypy", *args, *sys.argv[1:]], cwd=TREE)


if __name__ == "__main__":
    sys.exit(main())
