"""Options of a curvature analysis (``analyze``), torch-free.

One definition for the engine (``workers/curvplan_worker/curvature/analyze.py``) and the API,
which validates an ``analyze`` job's options before queueing it and must never import torch
(like ``spec.py``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic.json_schema import SkipJsonSchema

Pattern = Annotated[str, Field(min_length=1, max_length=200)]


class OptionsError(ValueError):
    """Invalid analysis options; ``errors`` lists ``(field, message)``."""

    def __init__(self, errors: list[tuple[str, str]]) -> None:
        self.errors = errors
        super().__init__("invalid analysis options: " + "; ".join(f"{f}: {m}" for f, m in errors))


_BYTE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_BYTE_SIZE = re.compile(r"^\s*(?P<number>\d+(?:\.\d*)?|\.\d+)\s*(?P<unit>[a-zA-Z]*)\s*$")


def parse_byte_size(value: Any) -> int | None:
    """A size in bytes from ``8589934592``, ``"8GiB"``, ``"512 MiB"``, ``"1.5GB"`` (decimal
    units k/M/G/T[B], binary KiB/MiB/GiB/TiB); None/"" for unset. ValueError when it is not
    a positive size."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, bool):
        raise ValueError("expected a size in bytes such as 8GiB or 8589934592, not a boolean")
    if isinstance(value, int | float):
        number, unit = float(value), ""
    else:
        m = _BYTE_SIZE.match(str(value))
        if m is None or m.group("unit").lower() not in _BYTE_UNITS:
            raise ValueError(
                f"expected a size in bytes such as 8GiB, 512MiB, 16GB or 8589934592, "
                f"got {str(value)[:40]!r}"
            )
        number, unit = float(m.group("number")), m.group("unit").lower()
    size = int(number * _BYTE_UNITS[unit])
    if size < 1:
        raise ValueError(f"a memory budget must be at least 1 byte, got {str(value)[:40]!r}")
    return size


class MachineSettings(BaseModel):
    """How the engine runs on its machine: configured per worker, never per request.

    A worker reads them from its environment (``CURVPLAN_WORKER_DEVICE``,
    ``CURVPLAN_WORKER_THREADS``, ``CURVPLAN_WORKER_SELF_TEST``, ``CURVPLAN_WORKER_CACHE_GRAPH``,
    ``CURVPLAN_WORKER_MEMORY_BUDGET``) or the flags of ``curvplan worker``; ``curvplan
    curvature analyze`` takes them as flags.
    """

    model_config = ConfigDict(extra="forbid")

    device: str = Field(default="auto", description="auto, cpu or cuda[:index]")
    threads: int | None = Field(default=None, ge=1, description="torch intra-op threads")
    self_test: bool = Field(
        default=True, description="check HVPs against finite differences before measuring"
    )
    cache_graph: bool = Field(
        default=True, description="keep the gradient graph between products (false: less memory)"
    )
    memory_budget: int | None = Field(
        default=None,
        ge=1,
        description="bytes the curvature products may use on top of the model and data (e.g. "
        "8GiB); unset: the free CUDA memory × a safety factor; on a CPU worker 0.8 × its "
        "memory limit (CURVPLAN_WORKER_MEMORY_LIMIT) less what the job holds, unbounded outside "
        "a worker (docs/numerics.md#memory-plan)",
    )

    basis_budget: int = Field(
        default=2 * 1024**3,
        ge=1,
        description="bytes one block's Lanczos basis may hold (e.g. 2GiB): at most "
        "min(32, budget / (n · 4 bytes)) vectors (docs/numerics.md#bounded-basis)",
    )

    @field_validator("memory_budget", "basis_budget", mode="before")
    @classmethod
    def _memory_budget(cls, value: Any) -> int | None:
        return parse_byte_size(value)

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        if value not in ("auto", "cpu") and not value.startswith("cuda"):
            raise ValueError("expected auto, cpu or cuda[:index]")
        return value


#: Names that were request options and are now worker settings (a request naming one is a 422).
MACHINE_SETTINGS: tuple[str, ...] = tuple(MachineSettings.model_fields)


class BoundsOptions(BaseModel):
    """How the paper's bounds are evaluated (the engine's ``BoundOptions``; see
    ``docs/formulas.md`` for the corrections each choice applies)."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal["paper", "exact"] = Field(
        default="paper",
        description="paper: the paper's inequality chain; exact: first-order ingredients from "
        "dense Jacobians (where they have at most max_dense_entries entries)",
    )
    c_A: Literal["1/2", "1/L"] = Field(
        default="1/2", description="bound on ||dA/dT||: 1/2 (any attention) or the paper's 1/L"
    )
    A_norm: Literal["sqrt_L", "L"] = Field(
        default="sqrt_L", description="bound on ||A||_2: sqrt_L (row-stochastic) or the paper's L"
    )
    ln_norms: Literal["exact", "lemma4"] = Field(
        default="exact", description="LayerNorm Jacobian/Hessian norms: exact or Lemma 4 bounds"
    )
    sigma_min: Literal["per_row_std", "row_norm"] = Field(
        default="per_row_std", description="sigma_min of Lemma 4 (when ln_norms is lemma4)"
    )
    max_dense_entries: int = Field(default=4_000_000, ge=1)
    max_samples: int | None = Field(default=None, ge=1)


#: The validation context of a request as the API stored it (``curvplan.types.jobs``
#: ``parse_stored_request``): what older API versions accepted and stored is read leniently.
STORED_REQUEST: dict[str, bool] = {"stored_request": True}


def is_stored_request(info: ValidationInfo) -> bool:
    """Whether this validation reads a stored request (context :data:`STORED_REQUEST`)."""
    return isinstance(info.context, dict) and bool(info.context.get("stored_request"))


def _machine_setting(cls: type[BaseModel], value: Any, info: ValidationInfo) -> Any:
    if is_stored_request(info):
        # A job queued before they became worker settings still runs, under the worker's.
        return None
    name = str(info.field_name)
    flag = name.replace("_", "-")
    raise ValueError(
        f"{name} is a worker setting, not a request option: configure the worker "
        f"(CURVPLAN_WORKER_{name.upper()} or `curvplan worker --{flag}`)"
    )


_Removed = SkipJsonSchema[None]


class AnalysisOptions(BaseModel):
    """What ``analyze`` measures and how precisely (how it runs is :class:`MachineSettings`)."""

    model_config = ConfigDict(extra="forbid")

    blocks: Annotated[list[Pattern], Field(max_length=512)] | None = Field(
        default=None, description="fnmatch patterns on block names; all blocks when null"
    )
    block_definitions: Annotated[dict[str, list[Pattern]], Field(max_length=512)] | None = Field(
        default=None, description="custom blocks: {name: [parameter-name patterns]}"
    )
    tolerance: float = Field(
        default=1e-3,
        gt=0,
        lt=1,
        description="relative residual tolerance of every eigenvalue (planning grade: 1e-3, "
        "which float32 products certify; the budget needs λ_max to a few digits). Strict: "
        "tolerance=1e-6 with precision=float64",
    )
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
    trace_probes: int = Field(
        default=15,
        ge=0,
        le=10000,
        description="Hutch++ products per block trace (exact for blocks of at most this many "
        "parameters). The budget's numbers use no Hessian trace; the curvature summary shows "
        "it with its standard error, and 15 products (5 Hutchinson samples after a rank-5 "
        "sketch) give it to the digits shown there",
    )
    ggn: bool = False
    dense: Literal["auto", "on", "off"] = "auto"
    dense_limit: int = Field(default=3000, ge=1, le=20000)
    precision: Literal["float32", "float64"] = "float32"
    seed: int = Field(default=0, ge=0)
    eval_batch_size: int | None = Field(default=None, ge=1)
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
    noise_adaptive: bool = Field(
        default=True,
        description="at intermediate checkpoints, add gradient examples (doubling from "
        "noise_grad_examples, default 64) until the intervals of B_simple and B_noise lie "
        "within a factor 2 of their estimates or noise_max_examples are spent",
    )
    noise_max_examples: int = Field(default=1024, ge=2, le=1_000_000)
    noise_max_groups: int = Field(
        default=64,
        ge=4,
        le=4096,
        multiple_of=2,
        description="jackknife groups held in memory (each one D fp64 numbers)",
    )
    # block fan-out (docs/numerics.md#block-fan-out)
    fan_out: bool | None = Field(
        default=None,
        description="split the block spectra and off-diagonal pairs of an analysis with two or "
        "more blocks into analyze_blocks child jobs that several workers measure in parallel "
        "(the numbers equal a single-process run's), decided at submission: null (the "
        "default) when the estimated spectra take longer than the service's "
        "CURVPLAN_FAN_OUT_MIN_SECONDS and two or more gpu worker slots are live; true: "
        "always; false: one process measures everything",
    )
    fan_out_groups: int | None = Field(
        default=None,
        ge=1,
        le=256,
        description="child jobs of a fan-out, balanced by estimated cost (default: the live "
        "workers serving the gpu queue, at least 2; never more than the blocks)",
    )
    # theoretical bounds (BOUNDS helper)
    bounds: bool = True
    bound_options: BoundsOptions = Field(default_factory=BoundsOptions)
    # Worker settings (MachineSettings): named here only to answer a clear 422.
    device: _Removed = Field(default=None, exclude=True)
    threads: _Removed = Field(default=None, exclude=True)
    self_test: _Removed = Field(default=None, exclude=True)
    cache_graph: _Removed = Field(default=None, exclude=True)
    memory_budget: _Removed = Field(default=None, exclude=True)
    basis_budget: _Removed = Field(default=None, exclude=True)

    _no_machine_settings = field_validator(*MACHINE_SETTINGS, mode="before")(
        classmethod(_machine_setting)
    )


def parse_options(options: AnalysisOptions | Mapping[str, Any] | None) -> AnalysisOptions:
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
