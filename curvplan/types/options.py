"""Options of a curvature analysis (``analyze``), torch-free.

One definition for the engine (``workers/curvature/analyze.py``) and the API, which validates an
``analyze`` job's options before queueing it and must never import torch (like ``spec.py``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

Pattern = Annotated[str, Field(min_length=1, max_length=200)]


class OptionsError(ValueError):
    """Invalid analysis options; ``errors`` lists ``(field, message)``."""

    def __init__(self, errors: list[tuple[str, str]]) -> None:
        self.errors = errors
        super().__init__("invalid analysis options: " + "; ".join(f"{f}: {m}" for f, m in errors))


class AnalysisOptions(BaseModel):
    """What ``analyze`` measures and how precisely."""

    model_config = ConfigDict(extra="forbid")

    blocks: Annotated[list[Pattern], Field(max_length=512)] | None = Field(
        default=None, description="fnmatch patterns on block names; all blocks when null"
    )
    block_definitions: Annotated[dict[str, list[Pattern]], Field(max_length=512)] | None = Field(
        default=None, description="custom blocks: {name: [parameter-name patterns]}"
    )
    tolerance: float = Field(default=1e-6, gt=0, lt=1, description="relative residual tolerance")
    residual_floor: float = Field(
        default=1e-3,
        ge=0,
        le=1,
        description="eigenvalues below floor·‖H_B‖ are certified to tol·floor·‖H_B‖ absolutely",
    )
    max_iter: int = Field(default=300, ge=2, le=10000)
    top_k: int = Field(default=0, ge=0, le=100)
    off_diagonal: bool | list[tuple[Pattern, Pattern]] = Field(
        default=False, description="true: every pair of blocks; or a list of [row, col] pairs"
    )
    trace_probes: int = Field(default=30, ge=0, le=10000)
    ggn: bool = False
    dense: Literal["auto", "on", "off"] = "auto"
    dense_limit: int = Field(default=3000, ge=1, le=20000)
    precision: Literal["float32", "float64"] = "float32"
    device: str = "auto"
    seed: int = Field(default=0, ge=0)
    eval_batch_size: int | None = Field(default=None, ge=1)
    cache_graph: bool = True
    self_test: bool = True
    threads: int | None = Field(default=None, ge=1, description="torch intra-op threads")
    # per-sample statistics (STATS helper's functions)
    per_sample: bool = True
    perturbation_radius: float = Field(default=1e-2, gt=0)
    n_directions: int = Field(default=8, ge=0, le=1000)
    top_d: int = Field(default=0, ge=0, le=64)
    hessian_subsample: int = Field(default=8, ge=0)
    per_sample_max_iter: int = Field(default=100, ge=2)
    # gradient noise (STATS helper)
    gradient_noise: bool = True
    noise_grad_examples: int | None = Field(default=None, ge=2)
    noise_hessian_examples: int | None = Field(default=None, ge=1)
    # theoretical bounds (BOUNDS helper)
    bounds: bool = True
    bound_options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        if value not in ("auto", "cpu") and not value.startswith("cuda"):
            raise ValueError("expected auto, cpu or cuda[:index]")
        return value


def parse_options(options: AnalysisOptions | dict | None) -> AnalysisOptions:
    """Validate options; raise :class:`OptionsError` naming each invalid field."""
    if isinstance(options, AnalysisOptions):
        return options
    try:
        return AnalysisOptions.model_validate(options or {})
    except ValidationError as exc:
        errors = [
            (".".join(str(p) for p in e["loc"]) or "<options>", e["msg"]) for e in exc.errors()
        ]
        raise OptionsError(errors) from None
