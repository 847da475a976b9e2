"""Collects the plan's warnings (stable codes, see schemas.WarningCode)."""

from __future__ import annotations

from curvplan.types.planner import PlanWarning, WarningCode


class WarningLog:
    """Ordered list of warnings; the same (code, section, detail) is recorded once."""

    def __init__(self) -> None:
        self.items: list[PlanWarning] = []

    def add(self, code: WarningCode, section: str, detail: str) -> None:
        warning = PlanWarning(code=code, section=section, detail=detail)
        if warning not in self.items:
            self.items.append(warning)

    def codes(self) -> list[str]:
        return [w.code for w in self.items]
