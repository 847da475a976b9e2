"""The locks: requirements/<name>.txt, every package pinned with its sha256 hashes.

    python scripts/lock.py            # rewrite the locks from pyproject.toml (`make lock`)
    python scripts/lock.py --check    # exit 1 when the locks drift from pyproject.toml or .venv

One lock per way the project is installed, each the whole dependency closure of the base
install plus its extras, installed with ``pip install --require-hashes -r requirements/X.txt``
(then the project itself with ``--no-deps``):

- ``base``   the client and its CLI (the ``client`` image)
- ``mlflow`` the client with ``--mlflow`` (the ``client`` image, ``CLIENT_EXTRAS=mlflow``)
- ``server`` the API (the ``api`` image; no torch)
- ``worker`` the worker (the ``worker`` image): the CUDA build of torch from PyPI with its
  CUDA wheels (nvidia-*, triton), each pinned with its hashes
- ``dev``    ``make install``: server, worker and dev extras with the CPU build of torch
  (the wheel under /opt/wheels; see docs/development.md)

Writing resolves with ``uv pip compile --generate-hashes`` against PyPI for CPython 3.11 on
x86_64 Linux (manylinux_2_28, what the images and CI run). The dev lock is resolved first,
keeping the versions it already pins (uv prefers the pins of the file it rewrites); every
other lock is constrained to the dev lock's versions, so each image installs the versions the
tests ran with. Each lock records a digest of pyproject.toml's dependency tables.

The check needs no network: each lock's digest matches pyproject.toml, every pin carries a
hash, the extra's own requirements are pinned at versions their specifiers admit, the images'
locks agree with the dev lock, and (unless ``--no-venv``) .venv holds exactly the dev lock.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
LOCKS_DIR = ROOT / "requirements"
PYPROJECT = ROOT / "pyproject.toml"

#: The torch release every lock pins (the CPU build for `make install`, the CUDA build in the
#: worker image). /opt/wheels holds the CPU wheel of this release on the project's machines.
TORCH = "2.13.0"
CPU_WHEELS = Path("/opt/wheels")
PYTHON_VERSION = "3.11"
PLATFORM = "x86_64-manylinux_2_28"
#: Installed by the venv itself, not by the lock (and the project, installed editable).
NOT_LOCKED = {"pip", "curvplan"}
STAMP = "# pyproject-dependencies-sha256: "


@dataclass(frozen=True)
class Lock:
    extras: tuple[str, ...]
    purpose: str
    #: The torch pin: the CPU build (local label ``+cpu``) or PyPI's own (the CUDA build).
    torch: str | None = None

    def path(self, name: str) -> Path:
        return LOCKS_DIR / f"{name}.txt"


LOCKS: dict[str, Lock] = {
    "dev": Lock(("server", "worker", "dev"), "make install (.venv, CI)", f"torch=={TORCH}+cpu"),
    "base": Lock((), "the client image"),
    "mlflow": Lock(("mlflow",), "the client image with CLIENT_EXTRAS=mlflow"),
    "server": Lock(("server",), "the api image"),
    "worker": Lock(("worker",), "the worker image (CUDA build of torch)", f"torch=={TORCH}"),
}


def declared(extras: list[str] | tuple[str, ...]) -> list[str]:
    """pyproject.toml's requirements of the base install plus ``extras`` (``curvplan[...]``
    self-references expanded)."""
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


def digest() -> str:
    """What the locks were written from: pyproject.toml's dependency tables and the torch pin."""
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    source = {
        "dependencies": project["dependencies"],
        "optional-dependencies": project.get("optional-dependencies", {}),
        "locks": {name: [lock.extras, lock.torch] for name, lock in LOCKS.items()},
    }
    return hashlib.sha256(json.dumps(source, sort_keys=True).encode()).hexdigest()


def header(name: str, lock: Lock) -> str:
    extras = ", ".join(lock.extras) or "none"
    return (
        f"# The lock for {lock.purpose}: the base dependencies plus extras: {extras}.\n"
        f"# pip install --require-hashes -r requirements/{name}.txt\n"
        "# Written by `make lock` (scripts/lock.py, uv pip compile); do not edit.\n"
        f"{STAMP}{digest()}\n"
    )


def parse(text: str) -> dict[str, tuple[str, int]]:
    """A lock's pins: canonical name -> (version, number of hashes)."""
    pins: dict[str, tuple[str, int]] = {}
    joined = re.sub(r"\\\n", " ", text)
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "-")):
            continue
        spec, *options = line.split(" --hash=")
        name, version = spec.strip().split("==", 1)
        name = re.sub(r"\[.*\]", "", name)
        hashes = [o for o in options if o.strip().startswith("sha256:")]
        pins[canonicalize_name(name)] = (version.split(";", 1)[0].strip(), len(hashes))
    return pins


def _compile(name: str, lock: Lock, constraints: list[str]) -> None:
    path = lock.path(name)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as handle:
        handle.write("\n".join(constraints) + "\n")
    command = [
        *(sys.executable, "-m", "uv", "pip", "compile", "pyproject.toml", "--quiet"),
        *(arg for extra in lock.extras for arg in ("--extra", extra)),
        *("--generate-hashes", "--no-header", "--python-version", PYTHON_VERSION),
        *("--python-platform", PLATFORM, "-c", handle.name, "-o", str(path)),
    ]
    if lock.torch and "+cpu" in lock.torch:
        command += ["--find-links", str(CPU_WHEELS)]
    try:
        subprocess.run(command, cwd=ROOT, check=True)
    finally:
        Path(handle.name).unlink()
    path.write_text(header(name, lock) + path.read_text())
    print(f"wrote {path.relative_to(ROOT)}")


def write() -> None:
    LOCKS_DIR.mkdir(exist_ok=True)
    dev = LOCKS["dev"]
    _compile("dev", dev, [dev.torch] if dev.torch else [])
    shared = parse(dev.path("dev").read_text())
    for name, lock in LOCKS.items():
        if name == "dev":
            continue
        pins = [f"{n}=={v}" for n, (v, _) in sorted(shared.items()) if n != "torch"]
        _compile(name, lock, pins + ([lock.torch] if lock.torch else []))


def _installed() -> dict[str, str]:
    frozen = subprocess.run(
        [sys.executable, "-m", "pip", "freeze", "--exclude-editable", "--all"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    pins = {}
    for line in frozen.splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==", 1)
            pins[canonicalize_name(name)] = version
    return {n: v for n, v in pins.items() if n not in NOT_LOCKED}


def problems(check_venv: bool = True) -> list[str]:
    """Every way the locks and pyproject.toml (and .venv) disagree; [] when they agree."""
    found: list[str] = []
    stamp = f"{STAMP}{digest()}"
    locks: dict[str, dict[str, tuple[str, int]]] = {}
    for name, lock in LOCKS.items():
        path = lock.path(name)
        if not path.exists():
            found.append(f"{path.name}: missing")
            continue
        text = path.read_text()
        if stamp not in text.splitlines():
            found.append(f"{path.name}: written from another pyproject.toml dependency list")
        pins = locks[name] = parse(text)
        found += [f"{path.name}: {n} has no hash" for n, (_, h) in pins.items() if not h]
        for spec in declared(lock.extras):
            req = Requirement(spec)
            pin = pins.get(canonicalize_name(req.name))
            if pin is None:
                found.append(f"{path.name}: {req.name} (from pyproject.toml) is not pinned")
            elif not req.specifier.contains(pin[0], prereleases=True):
                found.append(f"{path.name}: {req.name}=={pin[0]} outside {req.specifier}")
        if lock.torch and pins.get("torch", ("", 0))[0] != lock.torch.split("==")[1]:
            found.append(f"{path.name}: torch is not pinned at {lock.torch}")
    dev = locks.get("dev", {})
    for name, pins in locks.items():
        for package, (version, _) in pins.items():
            if package in dev and package != "torch" and dev[package][0] != version:
                found.append(f"{name}.txt: {package}=={version}, dev.txt pins {dev[package][0]}")
    if check_venv and dev:
        installed = _installed()
        wanted = {n: v for n, (v, _) in dev.items()}
        for package in sorted(installed.keys() | wanted.keys()):
            if installed.get(package) != wanted.get(package):
                found.append(
                    f".venv: {package} {installed.get(package, 'not installed')},"
                    f" dev.txt {wanted.get(package, 'not pinned')}"
                )
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, write nothing")
    parser.add_argument("--no-venv", action="store_true", help="--check leaves .venv out")
    args = parser.parse_args()
    if not args.check:
        write()
    found = problems(check_venv=not args.no_venv)
    for line in found:
        print(line, file=sys.stderr)
    if found:
        print("the locks differ: run `make lock` (then `make install`)", file=sys.stderr)
    return int(bool(found))


if __name__ == "__main__":
    sys.exit(main())
