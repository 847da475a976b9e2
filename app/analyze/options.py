"""Options of an ``analyze`` job: what the curvature engine measures and how hard it tries.

Every field has a default that suits a small model on a CPU; the worker passes them to the
engine (``workers.analysis.pipeline``). Limits keep one job from asking for unbounded work.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

BlockPatterns = Annotated[
    list[Annotated[str, Field(min_length=1, max_length=200)]], Field(min_length=1, max_length=64)
]


class AnalyzeOptions(BaseModel):
    """Engine options (Lanczos tolerances, sample sizes, precision, seed…)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    blocks: Annotated[dict[str, BlockPatterns], Field(max_length=512)] | None = Field(
        default=None,
        description="Custom blocks: block name → fnmatch patterns of parameter names "
        "(default: the engine's per-sublayer blocks).",
    )
    tol: float = Field(default=1e-6, gt=0, lt=1, description="Lanczos relative residual tolerance.")
    max_iter: int | None = Field(
        default=None, ge=2, le=2000, description="Lanczos iterations per block (default: engine)."
    )
    trace_products: int = Field(
        default=30, ge=3, le=3000, description="Hessian products per block for Hutch++ traces."
    )
    off_diagonal: Literal["none", "adjacent", "all"] = Field(
        default="adjacent",
        description="Off-diagonal blocks H_ij whose spectral norm is measured.",
    )
    radius: float | None = Field(
        default=None,
        gt=0,
        description="Perturbation radius r for losses at w* + r·u (default: targets.radius, "
        "else no perturbed losses).",
    )
    perturbation_directions: int = Field(default=8, ge=1, le=1024)
    per_sample_hessians: int = Field(
        default=16, ge=0, le=4096, description="Examples whose Hessian norm is measured (M)."
    )
    max_examples: int | None = Field(
        default=None, ge=1, description="Use only the first N examples of the dataset."
    )
    batch_size: int | None = Field(default=None, ge=1, description="Examples per forward pass.")
    precision: Literal["float64", "float32"] = "float64"
    device: Literal["auto", "cpu", "cuda"] = Field(
        default="auto", description="auto: CUDA when the worker has a GPU."
    )
    dense: Literal["auto", "always", "never"] = Field(
        default="auto", description="Exact dense Hessian (auto: only for small models)."
    )
    bounds: bool = Field(default=True, description="Evaluate the paper's block bounds.")
    seed: int = Field(default=0, ge=0, lt=2**31)

    @field_validator("blocks")
    @classmethod
    def _names(cls, value: dict[str, list[str]] | None) -> dict[str, list[str]] | None:
        if value is not None:
            for name in value:
                if not name or len(name) > 200:
                    raise ValueError("block names must have 1 to 200 characters")
        return value
