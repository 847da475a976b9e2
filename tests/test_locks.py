"""The hashed locks (requirements/*.txt, scripts/lock.py) agree with pyproject.toml.

Offline: the check reads the files only. The drift cases edit a copy of pyproject.toml and of
the locks and expect the check to name what changed.
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def lock() -> ModuleType:
    sys.path.insert(0, str(ROOT / "scripts"))
    import lock

    return lock


@pytest.fixture()
def copy(lock: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """pyproject.toml and requirements/ copied to tmp_path, the check pointed at the copies."""
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    shutil.copytree(ROOT / "requirements", tmp_path / "requirements")
    monkeypatch.setattr(lock, "PYPROJECT", tmp_path / "pyproject.toml")
    monkeypatch.setattr(lock, "LOCKS_DIR", tmp_path / "requirements")
    return tmp_path


def test_the_locks_match_pyproject(lock: ModuleType) -> None:
    assert lock.problems(check_venv=False) == []


def test_every_pin_has_hashes_and_torch_builds_are_the_right_ones(lock: ModuleType) -> None:
    pins = {n: lock.parse((ROOT / "requirements" / f"{n}.txt").read_text()) for n in lock.LOCKS}
    assert all(h >= 1 for p in pins.values() for _, h in p.values())
    assert pins["dev"]["torch"][0] == f"{lock.TORCH}+cpu"  # the CPU wheel, for make install
    assert pins["worker"]["torch"][0] == lock.TORCH  # PyPI's: the CUDA build
    assert any(n.startswith("nvidia-") for n in pins["worker"])  # its CUDA wheels, hashed
    for name in ("base", "mlflow", "server"):
        assert "torch" not in pins[name] and not any(n.startswith("nvidia") for n in pins[name])
    # The client image's lock stays the client's: no server dependency.
    assert not {"fastapi", "sqlalchemy", "numpy"} & pins["base"].keys()


def test_a_new_dependency_is_drift(lock: ModuleType, copy: Path) -> None:
    pyproject = copy / "pyproject.toml"
    text = pyproject.read_text()
    pyproject.write_text(text.replace('"typer>=0.12",', '"typer>=0.12",\n    "tomli-w>=1",', 1))
    found = lock.problems(check_venv=False)
    for name in lock.LOCKS:
        assert f"{name}.txt: written from another pyproject.toml dependency list" in found
        assert f"{name}.txt: tomli-w (from pyproject.toml) is not pinned" in found


def test_a_pin_outside_its_specifier_or_without_hash_is_caught(
    lock: ModuleType, copy: Path
) -> None:
    server = copy / "requirements" / "server.txt"
    text = server.read_text()
    version = re.search(r"^fastapi==(\S+) ", text, re.MULTILINE).group(1)  # type: ignore[union-attr]
    text = text.replace(f"fastapi=={version} ", "fastapi==0.100.0 ", 1)
    # One pin loses its hashes: the line ends at the version.
    idna = r"^(idna==\S+) \\\n(\s+--hash=\S+ \\\n)*\s+--hash=\S+\n"
    text = re.sub(idna, r"\1\n", text, count=1, flags=re.MULTILINE)
    server.write_text(text)
    found = lock.problems(check_venv=False)
    assert any(p.startswith("server.txt: fastapi==0.100.0 outside >=0.121") for p in found), found
    assert "server.txt: idna has no hash" in found
    assert f"server.txt: fastapi==0.100.0, dev.txt pins {version}" in found
