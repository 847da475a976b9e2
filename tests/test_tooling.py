"""CI runs the static checks through the README's test command (`make test` → `make lint`)."""

from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _recipe(makefile: str, target: str) -> tuple[list[str], list[str]]:
    match = re.search(rf"^{re.escape(target)}:([^\n]*)\n((?:\t[^\n]*\n)*)", makefile, re.M)
    assert match, f"no target {target!r}"
    return match.group(1).split(), [line.strip() for line in match.group(2).splitlines()]


def test_ci_runs_the_static_checks_through_make_test() -> None:
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    makefile = (ROOT / "Makefile").read_text()
    deps, _ = _recipe(makefile, "test")
    assert "lint" in deps
    _, lint = _recipe(makefile, "lint")
    joined = "\n".join(lint)
    for command in (
        "ruff check .",
        "ruff format --check .",
        "lint-imports",
        "mypy",
        "scripts/lock.py --check",
    ):
        assert command in joined, command
    _, fast = _recipe(makefile, "test-fast")
    assert any('-m "not e2e and not slow"' in line for line in fast)


def test_chromium_is_installed_by_the_set_up_not_by_a_test_target() -> None:
    """The report-page tests need Chromium: the install step (the stamp ``make test`` and
    ``make run`` depend on) sets it up, and no test target installs anything itself."""
    makefile = (ROOT / "Makefile").read_text()
    deps, stamp = _recipe(makefile, "$(STAMP)")
    assert "scripts/ensure_chromium.sh" in deps  # a changed script re-runs the set-up
    assert "bash scripts/ensure_chromium.sh" in stamp
    install_deps, _ = _recipe(makefile, "install")
    assert install_deps == ["$(STAMP)"]
    for target in ("test", "test-fast"):
        deps, recipe = _recipe(makefile, target)
        assert "install" in deps
        assert not any("chromium" in line or "apt-get" in line for line in recipe), target


def test_layering_contracts_and_mypy_settings_are_declared() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    sources = {m for c in contracts for m in c.get("source_modules", [])}
    assert {"curvplan.types", "curvplan.client", "curvplan_server", "curvplan_core"} <= sources
    assert "curvplan_worker.curvature" in sources
    layered = [c["layers"] for c in contracts if c["type"] == "layers"]
    assert [
        "curvplan.commands",
        "curvplan_server | curvplan_worker",
        "curvplan_core",
        "curvplan.types",
    ] in layered
    # the cycles kept broken (docs/layout.md)
    assert ["curvplan_worker.kinds", "curvplan_worker.analyze"] in layered
    assert ["curvplan_server.jobs", "curvplan_server.analyze"] in layered
    forbidden: dict[str, set[str]] = {}
    for c in contracts:
        for source in c.get("source_modules", []):
            forbidden.setdefault(source, set()).update(c["forbidden_modules"])
    assert {"torch"} <= forbidden["curvplan_server"] & forbidden["curvplan_core"]
    assert "fastapi" in forbidden["curvplan_worker"]
    assert "curvplan_worker.curvature.operator" in forbidden["curvplan_worker.curvature.memory"]
    mypy = config["tool"]["mypy"]
    assert "pydantic.mypy" in mypy["plugins"]
    assert {"curvplan", "app", "workers", "tests", "benchmarks"} <= set(mypy["files"])
    overrides = {tuple(o["module"]): o for o in mypy["overrides"]}
    assert "union-attr" in overrides[("tests.*", "benchmarks.*")]["disable_error_code"]
    assert overrides[("torch", "torch.*")]["follow_imports"] == "silent"
    assert overrides[("curvplan.types", "curvplan.types.*")]["disallow_untyped_defs"] is True
    # the planner is strict (the per-module flags: `strict` in an override leaks globally)
    planner = overrides[("curvplan_core.planner", "curvplan_core.planner.*")]
    assert "strict" not in planner and "disable_error_code" not in planner
    for flag in ("disallow_untyped_defs", "disallow_any_generics", "warn_return_any"):
        assert planner[flag] is True, flag
    lenient = [o for o in mypy["overrides"] if "disable_error_code" in o]
    assert not any(m.startswith("curvplan_core.planner") for o in lenient for m in o["module"])


def test_pre_commit_runs_the_same_checks() -> None:
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    hooks = {hook["id"]: hook for repo in config["repos"] for hook in repo["hooks"]}
    assert {"ruff-check", "ruff-format", "lint-imports", "mypy", "unasync", "openapi"} <= set(hooks)
    assert hooks["mypy"]["stages"] == ["pre-push"]  # the slow check before a push
    assert set(config["default_install_hook_types"]) == {"pre-commit", "pre-push", "commit-msg"}
    assert hooks["commit-subject"]["stages"] == ["commit-msg"]


def test_commit_message_check(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location(
        "check_commit_msg", ROOT / "scripts/check_commit_msg.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    main, problems = module.main, module.problems

    assert problems("Fix the reaper's fence\n\nWhy: a lost lease wrote twice.\n") == []
    assert problems("# git's comment\n" + "x" * 72) == []
    (long,) = problems("x" * 73)
    assert "73 characters" in long
    assert problems("subject\nbody without a blank line") != []
    assert problems("# only comments\n") == ["the message is empty"]
    message = tmp_path / "COMMIT_EDITMSG"
    message.write_text("y" * 80)
    assert main(["check_commit_msg.py", str(message)]) == 1
