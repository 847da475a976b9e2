"""Options of an ``analyze`` job, validated by the API before the job is queued.

A torch-free mirror of the curvature engine's ``AnalysisOptions``
(``workers/curvature/api.py``, which imports torch and so cannot be imported by the API):
same field names, bounds and defaults. Only the fields a client sets are stored and passed
to the engine, so the engine's own defaults apply to the rest.
``tests/analyze/test_analyze_worker.py`` checks that the two models stay in step.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

Pattern = Annotated[str, Field(min_length=1, max_length=200)]


class AnalyzeOptions(BaseModel):
    """What the engine measures and how precisely (see the engine's ``AnalysisOptions``)."""

    model_config = ConfigDict(extra="forbid")

    blocks: Annotated[list[Pattern], Field(max_length=512)] | None = Field(
        default=None, description="fnmatch patterns on block names; all blocks when null"
    )
    block_definitions: Annotated[dict[str, list[Pattern]], Field(max_length=512)] | None = Field(
        default=None, description="custom blocks: {name: [parameter-name patterns]}"
    )
    tolerance: float = Field(default=1e-6, gt=0, lt=1, description="Lanczos relative residual")
    residual_floor: float = Field(default=1e-3, ge=0, le=1)
    max_iter: int = Field(default=300, ge=2, le=10000, description="Lanczos iterations")
    top_k: int = Field(default=0, ge=0, le=100)
    off_diagonal: bool | list[tuple[Pattern, Pattern]] = Field(
        default=False, description="true: every pair of blocks; or a list of [row, col] pairs"
    )
    trace_probes: int = Field(default=30, ge=0, le=10000, description="Hutch++ products")
    ggn: bool = Field(default=False, description="Gauss-Newton and functional parts too")
    dense: Literal["auto", "on", "off"] = "auto"
    dense_limit: int = Field(default=3000, ge=1, le=20000)
    precision: Literal["float32", "float64"] = "float32"
    device: str = Field(default="auto", description="auto (CUDA when present), cpu, cuda[:i]")
    seed: int = Field(default=0, ge=0)
    eval_batch_size: int | None = Field(default=None, ge=1)
    threads: int | None = Field(default=None, ge=1, description="torch intra-op threads")
    cache_graph: bool = True
    self_test: bool = True
    per_sample: bool = True
    perturbation_radius: float = Field(default=1e-2, gt=0)
    n_directions: int = Field(default=8, ge=0, le=1000)
    top_d: int = Field(default=0, ge=0, le=64)
    hessian_subsample: int = Field(default=8, ge=0)
    per_sample_max_iter: int = Field(default=100, ge=2)
    gradient_noise: bool = True
    noise_grad_examples: int | None = Field(default=None, ge=2)
    noise_hessian_examples: int | None = Field(default=None, ge=1)
    bounds: bool = True
    bound_options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        if value not in ("auto", "cpu") and not value.startswith("cuda"):
            raise ValueError("expected auto, cpu or cuda[:index]")
        return value
