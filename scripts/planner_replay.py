"""Record the planner's inputs while tests run, and replay them to check that a refactor left
every output byte-equal.

Record (a pytest plugin; every distinct call of the wrapped functions, one pickle each):

    PLANNER_RECORD_DIR=/tmp/inputs PYTHONPATH=...:scripts \\
        pytest -p planner_replay tests/planner tests/sweep/test_sweep_fit.py

Replay (with the tree to check on PYTHONPATH; prints one sha256 over every output):

    python scripts/planner_replay.py /tmp/inputs /tmp/outputs-before

Run the replay once on the tree before the change and once after: equal digests (and
``diff -r`` of the two output folders) mean equal outputs for every recorded input. Outputs
are canonical text: floats by ``float.hex``, arrays by dtype, shape and the sha256 of their
bytes, pydantic models by their JSON, a raised error by its type and message.

The wrapped functions: ``make_plan`` (the whole recommendation), ``fit_steps_to_target``
(B_crit/S_min) and ``fit_power_law`` (the Δ_k power laws), wherever a module imported them.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import os
import pickle
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

#: name → (module, attribute) of each recorded function.
RECORDED = {
    "make_plan": ("curvplan_core.planner.plan", "make_plan"),
    "fit_steps_to_target": ("curvplan_core.planner.critical_batch", "fit_steps_to_target"),
    "fit_power_law": ("curvplan_core.planner.loss_curve", "fit_power_law"),
}


def _original(name: str) -> Callable[..., Any]:
    module, attribute = RECORDED[name]
    function: Callable[..., Any] = getattr(importlib.import_module(module), attribute)
    return getattr(function, "__wrapped__", function)


# --------------------------------------------------------------------------- recording
def _recording(name: str, function: Callable[..., Any], out: Path) -> Callable[..., Any]:
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            blob = pickle.dumps((name, args, kwargs), protocol=5)
        except Exception:  # an input a test built from something unpicklable: not recorded
            blob = b""
        if blob:
            digest = hashlib.sha256(blob).hexdigest()[:24]
            path = out / f"{name}-{digest}.pkl"
            if not path.exists():
                path.write_bytes(blob)
        return function(*args, **kwargs)

    wrapper.__planner_replay__ = True  # type: ignore[attr-defined]
    return wrapper


def _patch_everywhere(out: Path) -> None:
    """Replace each recorded function by its recording wrapper in every loaded module that
    holds it (``from … import fit_power_law`` binds it in the importing module)."""
    for name in RECORDED:
        original = _original(name)
        wrapper = _recording(name, original, out)
        for module in list(sys.modules.values()):
            try:
                current = getattr(module, RECORDED[name][1], None)
            except Exception:
                continue
            if current is original:
                setattr(module, RECORDED[name][1], wrapper)


def pytest_runtest_setup(item: Any) -> None:
    """Before every test: patch the modules loaded so far (test modules import lazily)."""
    folder = os.environ.get("PLANNER_RECORD_DIR")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        _patch_everywhere(Path(folder))


# --------------------------------------------------------------------------- replaying
def canonical(value: Any) -> Any:
    """A text-stable form of a planner output (see the module docstring)."""
    if hasattr(value, "model_dump_json"):
        return ["model", type(value).__name__, value.model_dump_json()]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [
            "dataclass",
            type(value).__name__,
            [[f.name, canonical(getattr(value, f.name))] for f in dataclasses.fields(value)],
        ]
    if isinstance(value, np.ndarray):
        data = np.ascontiguousarray(value)
        digest = hashlib.sha256(data.tobytes()).hexdigest()
        return ["ndarray", data.dtype.str, list(data.shape), digest]
    if isinstance(value, np.generic):
        return canonical(value.item())
    if isinstance(value, float):
        return ["float", value.hex()]
    if isinstance(value, list | tuple):
        return [type(value).__name__, [canonical(v) for v in value]]
    if isinstance(value, dict):
        return ["dict", [[str(k), canonical(v)] for k, v in value.items()]]
    return [type(value).__name__, repr(value)]


def replay(inputs: Path, outputs: Path) -> str:
    """Run every recorded call on the tree on ``sys.path``; write each output; the digest."""
    outputs.mkdir(parents=True, exist_ok=True)
    total = hashlib.sha256()
    for path in sorted(inputs.glob("*.pkl")):
        name, args, kwargs = pickle.loads(path.read_bytes())
        try:
            text = repr(canonical(_original(name)(*args, **kwargs)))
        except Exception as exc:
            text = f"raised {type(exc).__name__}: {exc}"
        (outputs / f"{path.stem}.txt").write_text(text)
        total.update(path.stem.encode() + b"\0" + text.encode() + b"\0")
    return total.hexdigest()


if __name__ == "__main__":
    source, target = Path(sys.argv[1]), Path(sys.argv[2])
    counts: dict[str, int] = {}
    for recorded in source.glob("*.pkl"):
        kind = recorded.stem.rsplit("-", 1)[0]
        counts[kind] = counts.get(kind, 0) + 1
    digest = replay(source, target)
    print(f"{sum(counts.values())} inputs {dict(sorted(counts.items()))}: sha256 {digest}")
