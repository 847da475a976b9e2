"""What an analysis will cost, before it runs: products per stage, and seconds (torch-free).

One cost model for the API (a submission's estimate from the parameters, tokens and blocks of
the config or spec) and the worker (the same stages with the milliseconds of one measured
product, then the ETA while it runs; docs/operations.md#cost-model-and-eta). Standard library only.

The unit is one *product*: a Hessian-vector product over the whole evaluation sample (one
second backward through every micro-batch's graph). Each stage's work is counted in products:

* block spectra: one Lanczos run per block serves λ_max and λ_min; it needs
  :func:`expected_lanczos_steps` products (at most min(max_iter, n)), plus ``trace_probes``
  Hutch++ products (n for a block of n ≤ trace_probes, traced exactly), plus two more
  Lanczos runs with ``ggn`` (GGN and functional parts);
* off-diagonal σ_max: Lanczos on H_rcᵀH_rc, two products per step, rank ≤ min(n_r, n_c);
* dense: one product per parameter (the Hessian's columns);
* top eigenspace: one Lanczos run over all parameters;
* per-sample and gradient-noise statistics: per-example passes, each counted as its 1/N
  share of a product plus :data:`PER_EXAMPLE_OVERHEAD` (a forward pass over the sample is
  about a third of a product).

Seconds are products × milliseconds per product: measured by the worker before the spectra,
else the prior :func:`prior_ms_per_product` from the FLOPs of one product (about 12 · P · T
for P parameters and T tokens: forward 2PT, first backward 4PT, second backward through the
first backward's graph about 6PT) at :data:`PRIOR_FLOPS_PER_SECOND`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

PRODUCT_FLOPS_PER_PARAM_TOKEN = 12.0
"""FLOPs of one Hessian-vector product per parameter and token (see the module docstring)."""

PRIOR_FLOPS_PER_SECOND = 2.0e10
"""Throughput the prior assumes (one fp32 CPU core with AVX2 sustains a few 10¹⁰ in GEMM);
the worker's measured product replaces it."""

FORWARD_SHARE = 1.0 / 3.0
"""A forward pass as a share of one product (2PT of about 12PT, with fixed costs)."""

PER_EXAMPLE_OVERHEAD = 0.2
"""What one per-example product costs on top of its 1/N share of the FLOPs, in products: the
fixed cost of a forward and two backward passes on one example. Calibrated on the ``curvplan
example`` model on CPU (benchmarks/results/defaults-cpu.txt), where per-example work is mostly
fixed cost; on large models it overestimates, and the ETA corrects it as the stage runs."""

PER_SAMPLE_STEPS = 40
"""Prior Lanczos steps of one example's Hessian norm (at most ``per_sample_max_iter``)."""

NOISE_PRODUCTS_PER_EXAMPLE = 5.0
"""Per-example products the gradient-noise statistics spend per example they use (per-example
gradients, their jackknife groups and the Hessian quadratic forms gᵀHg); calibrated like
:data:`PER_EXAMPLE_OVERHEAD`."""

STEPS_BASE = 20.0
STEPS_PER_DIGIT = 10.0
"""Prior Lanczos steps for both ends of a block to a relative tolerance: BASE + PER_DIGIT ·
log10(1/tol). Lanczos converges geometrically at the extremes (Kaniel–Paige–Saad bound,
Saad 1980, "On the rates of convergence of the Lanczos and the block-Lanczos methods", SIAM
J. Numer. Anal. 17(5)), so steps grow with the digits asked for; the constants are this
engine's typical counts on Transformer blocks, refined at run time by the blocks measured."""

FP32_CERTIFIABLE = 1e-5
"""Below this relative tolerance float32 products cannot certify the small end: such blocks
run to max_iter (docs/numerics.md)."""

TIME_OPTIONS = (
    "max_iter (fewer Lanczos steps), tolerance (1e-3 certifies in float32), blocks (fewer "
    "blocks), trace_probes, off_diagonal, dense, per_sample / gradient_noise (off), fewer or "
    "shorter examples (tokens), fan_out with more workers"
)
"""What a client changes to make an analysis shorter."""


@dataclass(frozen=True)
class CostOptions:
    """The analysis options the cost depends on (``curvplan.types.options.AnalysisOptions``
    has them all; :meth:`from_options` reads them from it or from a dict)."""

    tolerance: float = 1e-3
    precision: str = "float32"
    max_iter: int = 300
    trace_probes: int = 0
    ggn: bool = False
    dense: str = "auto"
    dense_limit: int = 3000
    top_d: int = 0
    top_k: int = 0
    per_sample: bool = True
    n_directions: int = 8
    hessian_subsample: int = 8
    per_sample_max_iter: int = 100
    gradient_noise: bool = True
    noise_grad_examples: int | None = None
    noise_hessian_examples: int | None = None

    @classmethod
    def from_options(cls, options: Any) -> CostOptions:
        get = options.get if isinstance(options, Mapping) else lambda k, d: getattr(options, k, d)
        defaults = cls()
        return cls(**{k: get(k, v) for k, v in asdict(defaults).items()})


@dataclass(frozen=True)
class StageCost:
    """One stage: expected and worst-case products, and the seconds they take."""

    stage: str
    products: float
    worst_products: float
    seconds: float
    items: dict[str, float] | None = None

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if self.items is None:
            out.pop("items")
        return out


@dataclass(frozen=True)
class CostEstimate:
    """An analysis's cost, stage by stage, at ``ms_per_product`` (``source`` says whence)."""

    stages: list[StageCost]
    ms_per_product: float
    ms_source: str
    setup_seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def products(self) -> float:
        return sum(s.products for s in self.stages)

    @property
    def seconds(self) -> float:
        return self.setup_seconds + sum(s.seconds for s in self.stages)

    @property
    def worst_seconds(self) -> float:
        return self.setup_seconds + sum(
            s.worst_products * self.ms_per_product / 1000.0 for s in self.stages
        )

    def stage(self, name: str) -> StageCost | None:
        return next((s for s in self.stages if s.stage == name), None)

    def as_dict(self) -> dict[str, Any]:
        return {
            "products": self.products,
            "seconds": self.seconds,
            "worst_seconds": self.worst_seconds,
            "ms_per_product": self.ms_per_product,
            "ms_source": self.ms_source,
            "setup_seconds": self.setup_seconds,
            "stages": [s.as_dict() for s in self.stages],
            "notes": list(self.notes),
        }


MAX_BASIS_VECTORS = 32
MIN_BASIS_VECTORS = 6
DEFAULT_BASIS_BUDGET = 2 * 1024**3
"""The bounded thick-restart basis of the engine's spectra (``curvature/spectra.py``, which
a worker test checks these against): at most 32 vectors, at least 6, 2 GiB by default."""

HOST_SAFETY = 0.8
"""The share of a worker's memory limit a job plans to fill (the rest: allocator slack, the
interpreter, what the plan does not model)."""


def basis_itemsize(precision: str) -> int:
    """Bytes of one basis element: float32, float64 only in strict (float64) precision."""
    return 8 if precision == "float64" else 4


def basis_vectors(n: int, budget: int | None = None, itemsize: int = 4, wanted: int = 2) -> int:
    """Vectors of the bounded Lanczos basis of an operator of size ``n`` with ``wanted`` Ritz
    vectors: min(32, ⌊budget / (n · itemsize)⌋), at least max(6, wanted + 4), at most n + 1
    (the whole Krylov space): thick-restart Lanczos (Wu & Simon 2000, SIAM J. Matrix Anal.
    Appl. 22(2), §3) in a basis bounded by memory (docs/numerics.md#bounded-basis)."""
    budget = DEFAULT_BASIS_BUDGET if budget is None else int(budget)
    fit = budget // max(1, n * itemsize)
    floor = max(MIN_BASIS_VECTORS, wanted + 4)
    return int(min(n + 1, max(floor, min(MAX_BASIS_VECTORS, fit))))


def basis_bytes(n: int, vectors: int, itemsize: int = 4) -> int:
    """Bytes of a basis of ``vectors`` vectors of size ``n``, plus the two float64 working
    vectors of a certification (a Ritz vector and its product)."""
    return int(vectors * n * itemsize + 2 * n * 8)


def lanczos_basis_bytes(
    n: int, budget: int | None = None, itemsize: int = 4, wanted: int = 2
) -> int:
    """Bytes of the bounded thick-restart Lanczos basis of an operator of ``n`` parameters
    (:func:`basis_vectors` vectors and the working vectors, :func:`basis_bytes`), whatever
    ``max_iter`` is (docs/numerics.md#bounded-basis)."""
    return basis_bytes(n, basis_vectors(n, budget, itemsize, wanted), itemsize)


def largest_basis_bytes(
    sizes: Mapping[str, int], options: Any, n_params: int, budget: int | None = None
) -> int:
    """The largest bounded Lanczos basis one block holds (float32, float64 in strict
    precision; ``budget`` the worker's basis budget), or the top eigenspace's (``top_d``:
    over every parameter, float64, the default budget): the least basis memory a run needs,
    since the lockstep spectra start no more blocks than their basis room holds."""
    opts = CostOptions.from_options(options)
    itemsize = basis_itemsize(opts.precision)
    wanted = max(1, opts.top_k) + 1  # the top-k (at least λ_max) and λ_min
    largest = max(
        (lanczos_basis_bytes(n, budget, itemsize, wanted) for n in sizes.values()), default=0
    )
    if opts.per_sample and opts.top_d > 0:
        largest = max(largest, lanczos_basis_bytes(n_params, None, 8, opts.top_d))
    return largest


def step_cap(n: int, opts: CostOptions) -> int:
    """The most Lanczos steps one run on ``n`` parameters makes: ``max_iter``, and at most n
    when the basis holds the whole Krylov space (no restart; it is exhausted after n steps).
    A restarted basis (fewer than n + 1 vectors) can take ``max_iter`` steps whatever n is."""
    whole_space = basis_vectors(n, None, basis_itemsize(opts.precision)) > n
    return max(1, min(opts.max_iter, n) if whole_space else opts.max_iter)


def expected_lanczos_steps(n: int, opts: CostOptions) -> float:
    """Prior products of one Lanczos run on a block of ``n`` parameters for both ends (at most
    :func:`step_cap`); see :data:`STEPS_BASE`."""
    cap = step_cap(n, opts)
    if opts.precision == "float32" and opts.tolerance < FP32_CERTIFIABLE:
        return float(cap)
    digits = math.log10(1.0 / max(opts.tolerance, 1e-16))
    return float(min(cap, STEPS_BASE + STEPS_PER_DIGIT * digits))


def block_products(n: int, opts: CostOptions, steps: float | None = None) -> tuple[float, float]:
    """(expected, worst) products of one block: its Lanczos run, the trace probes, and with
    ``ggn`` the GGN and functional Lanczos runs."""
    expected = expected_lanczos_steps(n, opts) if steps is None else steps
    worst = float(step_cap(n, opts))
    runs = 3 if opts.ggn else 1
    trace = min(opts.trace_probes, n)  # Hutch++ traces a block of n ≤ probes exactly, n products
    return runs * expected + trace, runs * worst + trace


def prior_ms_per_product(n_params: int, tokens: float) -> float:
    """Milliseconds of one product before any is measured: FLOPs / throughput (module doc)."""
    flops = PRODUCT_FLOPS_PER_PARAM_TOKEN * max(n_params, 1) * max(tokens, 1.0)
    return 1000.0 * flops / PRIOR_FLOPS_PER_SECOND


def estimate(
    *,
    blocks: Mapping[str, int],
    pairs: Sequence[Sequence[Any]],
    n_params: int,
    n_examples: int,
    tokens: float,
    options: Any,
    ms_per_product: float | None = None,
    first_product_ms: float | None = None,
    stages: Sequence[str] | None = None,
) -> CostEstimate:
    """The cost of an analysis, stage by stage.

    ``blocks``: name → parameters of the blocks measured here; ``pairs``: ``(row, col, n_row,
    n_col)`` off-diagonal pairs; ``tokens``: loss terms in the evaluation sample (examples ×
    sequence length for a language model); ``options``: analysis options (object or dict);
    ``stages``: only these stages (a fan-out child runs the spectra alone, its fan-in the
    rest); ``ms_per_product``: measured (else :func:`prior_ms_per_product`).
    """
    opts = CostOptions.from_options(options)
    source = "measured" if ms_per_product is not None else "prior (FLOPs)"
    ms = ms_per_product if ms_per_product is not None else prior_ms_per_product(n_params, tokens)
    n = max(n_examples, 1)
    out: list[StageCost] = []

    def add(stage: str, products: float, worst: float, items: dict[str, float] | None = None):
        if stages is not None and stage not in stages:
            return
        if products <= 0 and worst <= 0:
            return
        out.append(StageCost(stage, products, worst, products * ms / 1000.0, items))

    per_block = {name: block_products(size, opts) for name, size in blocks.items()}
    add(
        "blocks",
        sum(e for e, _ in per_block.values()),
        sum(w for _, w in per_block.values()),
        {name: e for name, (e, _) in per_block.items()},
    )
    pair_expected = {
        f"{p[0]}|{p[1]}": 2.0 * expected_lanczos_steps(min(int(p[2]), int(p[3])), opts)
        for p in pairs
    }
    pair_worst = sum(2.0 * step_cap(min(int(p[2]), int(p[3])), opts) for p in pairs)
    add("off_diagonal", sum(pair_expected.values()), pair_worst, pair_expected or None)
    if opts.dense == "on" or (opts.dense == "auto" and n_params <= opts.dense_limit):
        add("dense", float(n_params), float(n_params))
    if opts.per_sample and opts.top_d > 0:
        steps = expected_lanczos_steps(n_params, opts) + opts.top_d
        add("top_eigenspace", steps, float(min(opts.max_iter, n_params)))
    example = 1.0 / n + PER_EXAMPLE_OVERHEAD  # one per-example product, in products
    if opts.per_sample:
        forwards = (1 + opts.n_directions + (1 if opts.top_d else 0)) * FORWARD_SHARE
        subsample = min(opts.hessian_subsample, n)
        hessian = subsample * min(opts.per_sample_max_iter, PER_SAMPLE_STEPS) * example
        worst = subsample * opts.per_sample_max_iter * example
        add("per_sample", forwards + hessian, forwards + worst)
    if opts.gradient_noise and n >= 3:
        used = min((opts.noise_grad_examples or n) + (opts.noise_hessian_examples or 0), n)
        work = used * NOISE_PRODUCTS_PER_EXAMPLE * example
        add("gradient_noise", work, work)
    setup = 0.0
    if first_product_ms is not None and ms_per_product is not None:
        setup = max(0.0, first_product_ms - ms_per_product) / 1000.0
    notes = []
    if opts.precision == "float32" and opts.tolerance < FP32_CERTIFIABLE:
        notes.append(
            f"tolerance {opts.tolerance:g} in float32: blocks are expected to run to max_iter "
            f"({opts.max_iter}); 1e-3 certifies in float32"
        )
    return CostEstimate(out, ms, source, setup, notes)


def describe(estimate: CostEstimate) -> str:
    """``N products × M ms per product, <source>; <stage> S s, …`` (what an error names)."""
    stages = ", ".join(f"{s.stage} {s.seconds:.0f} s" for s in estimate.stages)
    return (
        f"{estimate.products:.0f} products × {estimate.ms_per_product:.1f} ms per product, "
        f"{estimate.ms_source}; {stages}"
    )


def format_duration(seconds: float | None) -> str:
    """``≈ 3 min``, ``≈ 45 s``, ``≈ 2.5 h`` (None: ``unknown``)."""
    if seconds is None or not math.isfinite(seconds):
        return "unknown"
    if seconds < 90:
        return f"≈ {max(seconds, 0):.0f} s"
    if seconds < 5400:
        return f"≈ {seconds / 60:.0f} min"
    return f"≈ {seconds / 3600:.1f} h"
