"""Options of the theoretical bounds and their validation (clear errors naming the field)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal


class BoundsOptionError(ValueError):
    """An option of the bounds that cannot be used; the message names the field."""


_CHOICES: dict[str, tuple[str, ...]] = {
    "mode": ("paper", "exact"),
    "c_A": ("1/2", "1/L"),
    "A_norm": ("sqrt_L", "L"),
    "ln_norms": ("exact", "lemma4"),
    "sigma_min": ("per_row_std", "row_norm"),
}


@dataclass(frozen=True)
class BoundOptions:
    """How the paper's bounds are evaluated (Petrov et al. 2025 with the corrections of
    docs/formulas.md#bounds).

    - ``mode``: ``paper`` evaluates the paper's inequality chain (Theorem 1 proof, App. B.6
      ingredient table, Prop. 10) from spectral norms of weights and activations; ``exact``
      replaces every first-order ingredient (||G_k||, ||B_i||, ||J_Z B_i||, ||J_Y G_k||,
      ||J_SY||, ||A||, ||d A/d T||, ||Y||, ||F - Target||) by its exact value from dense
      Jacobians (only where the Jacobian has at most ``max_dense_entries`` entries).
    - ``c_A``: bound on ||dA/dT||: ``1/2`` (valid for any attention; the correction) or ``1/L``
      (the paper's uniform-attention value, not a bound in general).
    - ``A_norm``: bound on ||A||_2: ``sqrt_L`` (row-stochastic, valid and tighter) or ``L``
      (the paper's).
    - ``ln_norms``: ``exact`` LayerNorm Jacobian/Hessian norms (Theorems 2-3 closed forms) or
      the ``lemma4`` bounds with ``sigma_min`` = ``per_row_std`` (corrected) or ``row_norm``
      (the lemma's literal definition, which is false).
    """

    mode: Literal["paper", "exact"] = "paper"
    c_A: Literal["1/2", "1/L"] = "1/2"
    A_norm: Literal["sqrt_L", "L"] = "sqrt_L"
    ln_norms: Literal["exact", "lemma4"] = "exact"
    sigma_min: Literal["per_row_std", "row_norm"] = "per_row_std"
    max_dense_entries: int = 4_000_000
    max_samples: int | None = None

    def __post_init__(self) -> None:
        for name, allowed in _CHOICES.items():
            value = getattr(self, name)
            if value not in allowed:
                raise BoundsOptionError(
                    f"bounds option {name!r}: expected one of {list(allowed)}, got {value!r}"
                )
        if not isinstance(self.max_dense_entries, int) or self.max_dense_entries < 1:
            raise BoundsOptionError(
                f"bounds option 'max_dense_entries': expected a positive integer, "
                f"got {self.max_dense_entries!r}"
            )
        if self.max_samples is not None and (
            not isinstance(self.max_samples, int) or self.max_samples < 1
        ):
            raise BoundsOptionError(
                f"bounds option 'max_samples': expected a positive integer or null, "
                f"got {self.max_samples!r}"
            )

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any] | BoundOptions | None) -> BoundOptions:
        """Build from a dict (e.g. JSON); unknown keys and bad values raise BoundsOptionError."""
        if options is None:
            return cls()
        if isinstance(options, BoundOptions):
            return options
        if not isinstance(options, Mapping):
            raise BoundsOptionError(f"bounds options: expected a mapping, got {type(options)}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise BoundsOptionError(
                f"bounds options: unknown field(s) {unknown}; known: {sorted(known)}"
            )
        return cls(**dict(options))

    def corrections(self) -> list[str]:
        """Names of the docs/formulas.md#bounds corrections these options apply (for the result
        record)."""
        out = []
        if self.mode == "exact":
            out += ["exact_c_A", "exact_A_norm"]
        else:
            if self.c_A == "1/2":
                out.append("c_A=1/2")
            if self.A_norm == "sqrt_L":
                out.append("A_norm=sqrt_L")
        if self.ln_norms == "exact":
            out.append("exact_ln_norms")
        elif self.sigma_min == "per_row_std":
            out.append("per_row_std_sigma_min")
        return out
