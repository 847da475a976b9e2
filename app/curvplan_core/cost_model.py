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
* full model: λ_max of the whole Hessian, one Lanczos run over every parameter for the top end
  alone (:data:`TOP_END_SHARE` of a block's steps), skipped when its float64 basis exceeds
  :data:`FULL_MODEL_BASIS_BYTES`;
* dense: one product per parameter (the Hessian's columns);
* top eigenspace: one Lanczos run over all parameters;
* per-sample and gradient-noise statistics: passes over part of the sample, each counted as
  its share of a product (1/N an example) plus :data:`PER_EXAMPLE_OVERHEAD` (a forward pass
  over the sample is about a third of a product); the gradient noise's are its Hessian
  quadratic forms (:func:`noise_cost`).

Seconds are products × milliseconds per product: measured by the worker before the spectra,
else the prior :func:`prior_ms_per_product` from the FLOPs of one product (about 12 · P · T
for P parameters and T tokens: forward 2PT, first backward 4PT, second backward through the
first backward's graph about 6PT) at :data:`PRIOR_FLOPS_PER_SECOND`.

The spectra are priced as they run (:class:`SpectraTiming`, measured by the worker before
them): a block's product costs what a warm product on *that* block costs (a block product's
second backward walks only the part of the graph between the loss and the block, so the
embedding's product costs several times a late layer's), and in batched lockstep each round
is one second backward of the vectors in flight, priced fixed + per vector
(:func:`lockstep_item_seconds`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, NotRequired, TypedDict

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

PER_SAMPLE_STEPS = 25
"""Prior Lanczos steps of one example's Hessian norm (at most ``per_sample_max_iter``): the mean
of the 24 per-example runs of the default analyses of the example (25.3), the tiny GPT-2 (23.4)
and the 4-layer Llama (26.1) in benchmarks/results/analyze-sizes-*.json (2026-12-03)."""

NOISE_HESSIAN_GROUPS = 4
"""The Hessian batch's groups in the gradient-noise statistics (the default
``n_hessian_groups`` of ``curvature/gradient_noise.py``, which imports it): each group's form
is one Hessian-vector product per gradient group."""

NOISE_MAX_EXAMPLES = 64
"""The gradient-noise split's default size of each half (``curvature/gradient_noise.py``'s
``DEFAULT_MAX_GRAD_EXAMPLES`` and ``DEFAULT_MAX_HESSIAN_EXAMPLES`` are this)."""

STEPS_BASE = 3.0
STEPS_PER_DIGIT = 10.0
"""Prior Lanczos steps for both ends of a block to a relative tolerance: BASE + PER_DIGIT ·
log10(1/tol). Lanczos converges geometrically at the extremes (Kaniel–Paige–Saad bound,
Saad 1980, "On the rates of convergence of the Lanczos and the block-Lanczos methods", SIAM
J. Numer. Anal. 17(5)), so steps grow with the digits asked for; the constants are this
engine's typical counts on Transformer blocks, refined at run time by the blocks measured.

Calibrated (a fit to three models, not a law) at tolerance 1e-3 to the count that prices the
time: each block's Lanczos products weighted by what one product on that block costs
(``SpectraTiming.item_ms``). The blocks near the input cost the most a product (their second
backward walks the whole graph) and certify in fewer products (20–45) than the cheap blocks
near the output (the head: 206 on the example, 309 on the Llama), so the plain mean count (47
example, 36 tiny GPT-2, 35.5 Llama) overprices the time, by +57 % on the tiny GPT-2's first ETA
(benchmarks/results/analyze-sizes-cpu-r26-run1.json). The cost-weighted means are 34.6 / 35.0
(example, two runs), 30.3 / 30.0 (tiny GPT-2) and 33.5 (Llama): the prior's 33. It
undercounts the products of a model with a slow head (the example's 1,208 products are
priced as about 900) but not their seconds. The example at 1e-4 took 23 % more than at 1e-3
(about 10 a digit)."""

TOP_END_SHARE = 0.5
"""Prior share of a both-ends Lanczos run's steps that the top end alone needs (λ_max converges
first). A guess: on the example and the tiny GPT-2 at tolerance 1e-3 the whole-model run made
12 products where this prior says 25 (benchmarks/results/analyze-sizes-cpu.txt)."""

FULL_MODEL_BASIS_BYTES = 4 * 2**30
"""The whole-model Lanczos basis the engine allows (``curvature/full_model.py``,
``FULL_BASIS_BYTES``, which a worker test checks this against): float64, n × (iterations + 1)."""

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
    noise_max_groups: int = 64

    @classmethod
    def from_options(cls, options: Any) -> CostOptions:
        get = options.get if isinstance(options, Mapping) else lambda k, d: getattr(options, k, d)
        defaults = cls()
        return cls(**{k: get(k, v) for k, v in asdict(defaults).items()})


class StageCostJson(TypedDict):
    """:class:`StageCost` as a result stores it (``curvplan.types.results.StageCost``)."""

    stage: str
    products: float
    worst_products: float
    seconds: float
    items: NotRequired[dict[str, float]]
    item_seconds: NotRequired[dict[str, float]]


class CostEstimateJson(TypedDict):
    """:class:`CostEstimate` as a result stores it (``curvplan.types.results.CostEstimate``)."""

    products: float
    seconds: float
    worst_seconds: float
    ms_per_product: float
    ms_source: str
    setup_seconds: float
    stages: list[StageCostJson]
    notes: list[str]


class SpectraTimingJson(TypedDict):
    """:class:`SpectraTiming`'s fields, as the cost inputs store them."""

    item_ms: dict[str, float]
    step_ms: dict[str, float]
    batched: bool
    vectors_per_product: int
    concurrent: int | None
    round_ms: float | None
    round_vectors: int
    one_vector_ms: float | None


@dataclass(frozen=True)
class StageCost:
    """One stage: expected and worst-case products, and the seconds they take."""

    stage: str
    products: float
    worst_products: float
    seconds: float
    items: dict[str, float] | None = None
    item_seconds: dict[str, float] | None = None

    @property
    def ms_per_product(self) -> float | None:
        """The stage's mean milliseconds per product (None without products)."""
        return 1000.0 * self.seconds / self.products if self.products > 0 else None

    def as_dict(self) -> StageCostJson:
        out: StageCostJson = {
            "stage": self.stage,
            "products": self.products,
            "worst_products": self.worst_products,
            "seconds": self.seconds,
        }
        if self.items is not None:
            out["items"] = dict(self.items)
        if self.item_seconds is not None:
            out["item_seconds"] = dict(self.item_seconds)
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
            s.worst_products * (s.ms_per_product or self.ms_per_product) / 1000.0
            for s in self.stages
        )

    def stage(self, name: str) -> StageCost | None:
        return next((s for s in self.stages if s.stage == name), None)

    def as_dict(self) -> CostEstimateJson:
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
"""The bounded thick-restart basis of the engine's spectra (``curvature/spectra.py`` uses
these): at most 32 vectors, at least 6, 2 GiB by default."""

SMALL_BASIS_BYTES = 16 * 1024**2
SMALL_BASIS_MAX_VECTORS = 320
"""A small operator's basis may take up to 16 MiB (at most 320 vectors: the default
``max_iter`` of 300 then never restarts) before the 32-vector bound applies: below that size
memory is not what limits the analysis, and every thick restart costs products. Measured on the
example's dense block Hessians (float32 products, tolerance 1e-3): 2,053 products with 32
vectors, 890 with the whole Krylov space (docs/numerics.md#bounded-basis). Past 320 a restart's
projection is a dense ≤ 320 × 320 eigenproblem a step (≈ 10 ms), the reason for the cap."""

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
    Appl. 22(2), §3) in a basis bounded by memory (docs/numerics.md#bounded-basis). A small
    operator may have more: as many as min(16 MiB, budget) holds, up to 320
    (:data:`SMALL_BASIS_BYTES`)."""
    budget = DEFAULT_BASIS_BUDGET if budget is None else int(budget)
    per_vector = max(1, n * itemsize)
    fit = budget // per_vector
    small = min(SMALL_BASIS_MAX_VECTORS, min(SMALL_BASIS_BYTES, budget) // per_vector)
    floor = max(MIN_BASIS_VECTORS, wanted + 4)
    return int(min(n + 1, max(floor, min(MAX_BASIS_VECTORS, fit), small)))


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


@dataclass(frozen=True)
class SpectraTiming:
    """How the spectra's products cost, measured by the worker before them
    (``curvplan_worker.curvature.limits.time_spectra``).

    ``item_ms``: a warm product on each block (``name``) or pair (``row|col``, the mean of its
    two directions) alone, what one product of that item costs in the loop path and in its
    trace and GGN runs. With ``batched`` (the lockstep's batched second backward), ``round_ms``
    is one batched product of ``round_vectors`` vectors in flight and ``one_vector_ms`` one of
    a single vector; at most ``vectors_per_product`` vectors go in one backward and at most
    ``concurrent`` items run at once (None: all). ``step_ms``: the Lanczos iteration's own
    milliseconds per product of each item (orthogonalisation, restarts, the coroutine), added
    to each Lanczos product whichever path runs it."""

    item_ms: dict[str, float] = field(default_factory=dict)
    step_ms: dict[str, float] = field(default_factory=dict)
    batched: bool = False
    vectors_per_product: int = 1
    concurrent: int | None = None
    round_ms: float | None = None
    round_vectors: int = 1
    one_vector_ms: float | None = None

    @classmethod
    def from_any(cls, value: SpectraTiming | Mapping[str, Any] | None) -> SpectraTiming | None:
        if value is None or isinstance(value, SpectraTiming):
            return value
        known = {k: value[k] for k in asdict(cls()) if k in value}
        for key in ("item_ms", "step_ms"):
            known[key] = {str(k): float(v) for k, v in (known.get(key) or {}).items()}
        return cls(**known)

    def round_cost(self) -> tuple[float, float]:
        """(fixed, per vector) milliseconds of one batched second backward: the line through
        the one-vector and the ``round_vectors``-vector products (proportional without the
        one-vector figure)."""
        v = max(int(self.round_vectors), 1)
        full = float(self.round_ms or 0.0)
        if v > 1 and self.one_vector_ms is not None:
            per_vector = max(full - float(self.one_vector_ms), 0.0) / (v - 1)
            return max(float(self.one_vector_ms) - per_vector, 0.0), per_vector
        if v == 1 and self.one_vector_ms is not None:
            return float(self.one_vector_ms), 0.0
        return 0.0, full / v

    def as_dict(self) -> SpectraTimingJson:
        return {
            "item_ms": dict(self.item_ms),
            "step_ms": dict(self.step_ms),
            "batched": self.batched,
            "vectors_per_product": self.vectors_per_product,
            "concurrent": self.concurrent,
            "round_ms": self.round_ms,
            "round_vectors": self.round_vectors,
            "one_vector_ms": self.one_vector_ms,
        }


def lockstep_item_seconds(rounds: Mapping[str, float], timing: SpectraTiming) -> dict[str, float]:
    """Seconds of each item of the batched lockstep spectra (``curvature/lockstep.py``), from
    the products each item makes (one per round while it runs).

    Items start in order while fewer than ``concurrent`` run; every round makes one product of
    each running item in ⌈m / vectors_per_product⌉ batched backwards for m running, costing
    ⌈m / c⌉ · fixed + m · per_vector (:meth:`SpectraTiming.round_cost`), shared equally among
    the m; a finished item drops out and the next starts. The sum over items is the stage's
    seconds: R rounds of m items each cost R · (⌈m / c⌉ · fixed + m · per_vector)."""
    fixed, per_vector = timing.round_cost()
    cap = max(int(timing.vectors_per_product), 1)
    queue = [(k, float(r)) for k, r in rounds.items()]
    limit = len(queue) if timing.concurrent is None else max(int(timing.concurrent), 1)
    seconds = {k: 0.0 for k, _ in queue}
    running: dict[str, float] = {}
    while queue or running:
        while queue and len(running) < limit:
            key, left = queue.pop(0)
            if left > 0:
                running[key] = left
        if not running:
            break
        m = len(running)
        share = (math.ceil(m / cap) * fixed + m * per_vector) / m / 1000.0
        step = min(running.values())  # rounds until the next item finishes
        for key in list(running):
            seconds[key] += step * share
            running[key] -= step
            if running[key] <= 1e-9:
                del running[key]
    return seconds


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
    spectra: SpectraTiming | Mapping[str, Any] | None = None,
    example: Mapping[str, Any] | None = None,
) -> CostEstimate:
    """The cost of an analysis, stage by stage.

    ``blocks``: name → parameters of the blocks measured here; ``pairs``: ``(row, col, n_row,
    n_col)`` off-diagonal pairs; ``tokens``: loss terms in the evaluation sample (examples ×
    sequence length for a language model); ``options``: analysis options (object or dict);
    ``stages``: only these stages (a fan-out child runs the spectra alone, its fan-in the
    rest); ``ms_per_product``: measured (else :func:`prior_ms_per_product`); ``spectra``: how
    the spectra's products cost (:class:`SpectraTiming`; without it every product costs
    ``ms_per_product``); ``example``: a product over every parameter on one example
    (``first_ms``, building its graph, then ``warm_ms``) and the Lanczos iteration's own
    ``step_ms`` there, which price the per-sample Hessian norms (:func:`per_sample_seconds`).
    """
    opts = CostOptions.from_options(options)
    source = "measured" if ms_per_product is not None else "prior (FLOPs)"
    ms = ms_per_product if ms_per_product is not None else prior_ms_per_product(n_params, tokens)
    n = max(n_examples, 1)
    out: list[StageCost] = []

    def add(
        stage: str,
        products: float,
        worst: float,
        items: dict[str, float] | None = None,
        item_seconds: dict[str, float] | None = None,
        seconds: float | None = None,
    ):
        if stages is not None and stage not in stages:
            return
        if products <= 0 and worst <= 0:
            return
        if seconds is None:
            seconds = sum(item_seconds.values()) if item_seconds else products * ms / 1000.0
        out.append(StageCost(stage, products, worst, seconds, items, item_seconds))

    per_block = {name: block_products(size, opts) for name, size in blocks.items()}
    pair_expected = {
        f"{p[0]}|{p[1]}": 2.0 * expected_lanczos_steps(min(int(p[2]), int(p[3])), opts)
        for p in pairs
    }
    block_seconds, pair_seconds = _spectra_seconds(
        {name: expected_lanczos_steps(size, opts) for name, size in blocks.items()},
        {name: e for name, (e, _) in per_block.items()},
        pair_expected,
        SpectraTiming.from_any(spectra),
        ms,
    )
    add(
        "blocks",
        sum(e for e, _ in per_block.values()),
        sum(w for _, w in per_block.values()),
        {name: e for name, (e, _) in per_block.items()},
        block_seconds,
    )
    pair_worst = sum(2.0 * step_cap(min(int(p[2]), int(p[3])), opts) for p in pairs)
    add(
        "off_diagonal", sum(pair_expected.values()), pair_worst, pair_expected or None, pair_seconds
    )
    whole = min(n_params, opts.max_iter)
    if 8 * n_params * (whole + 1) <= FULL_MODEL_BASIS_BYTES:
        top = min(float(whole), TOP_END_SHARE * expected_lanczos_steps(n_params, opts))
        add("full_model", top, float(whole))
    if opts.dense == "on" or (opts.dense == "auto" and n_params <= opts.dense_limit):
        add("dense", float(n_params), float(n_params))
    if opts.per_sample and opts.top_d > 0:
        steps = expected_lanczos_steps(n_params, opts) + opts.top_d
        add("top_eigenspace", steps, float(min(opts.max_iter, n_params)))
    one = 1.0 / n + PER_EXAMPLE_OVERHEAD  # one per-example product, in products
    if opts.per_sample:
        forwards = (1 + opts.n_directions + (1 if opts.top_d else 0)) * FORWARD_SHARE
        subsample = min(opts.hessian_subsample, n)
        hessian = subsample * min(opts.per_sample_max_iter, PER_SAMPLE_STEPS) * one
        worst = subsample * opts.per_sample_max_iter * one
        timed = per_sample_seconds(subsample, opts, example)
        add(
            "per_sample",
            forwards + hessian,
            forwards + worst,
            seconds=None if timed is None else forwards * ms / 1000.0 + timed,
        )
    if opts.gradient_noise and n >= 3:
        work, timed = noise_cost(n, opts, ms, example)
        add("gradient_noise", work, work, seconds=timed)
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


def depth_weights(
    products: Mapping[str, float], pairs: Sequence[Sequence[Any]]
) -> dict[str, float]:
    """Prior relative cost of one product of each block and pair, before any is measured (the
    fan-out's split at submission, ``analysis_plan``): ``products`` maps the blocks, in the
    model's forward order, and the pairs (``row|col``) to their expected products.

    A block product's second backward walks the graph between the loss and the block, so the
    i-th of B blocks gets (B − i) / B (the first, the embedding, 1; the last 1 / B); a pair the
    larger of its two blocks'. The weights are scaled so that Σ products · weight = Σ
    products: the total is the flat prior's, only its split moves. Against the warm products
    measured on the example and the tiny GPT-2 (benchmarks/results/fanout-cpu.txt, 2026-12-03)
    this predicts a block's product within a median factor 1.16-1.26 (at worst 2.7-7.6),
    where one figure for every block is off by a median 1.7-2.1 (at worst 19-38)."""
    names = [k for k in products if "|" not in k]
    b = max(len(names), 1)
    raw = {name: (b - i) / b for i, name in enumerate(names)}
    for p in pairs:
        raw[f"{p[0]}|{p[1]}"] = max(raw.get(str(p[0]), 1.0), raw.get(str(p[1]), 1.0))
    weighted = sum(products.get(k, 0.0) * w for k, w in raw.items())
    total = sum(products.get(k, 0.0) for k in raw)
    scale = total / weighted if weighted > 0 else 1.0
    return {k: w * scale for k, w in raw.items()}


def _spectra_seconds(
    lanczos: Mapping[str, float],
    block_total: Mapping[str, float],
    pairs: Mapping[str, float],
    timing: SpectraTiming | None,
    ms: float,
) -> tuple[dict[str, float] | None, dict[str, float] | None]:
    """Seconds of each block (its Lanczos ``lanczos`` products of ``block_total``, the rest its
    trace and GGN runs) and each pair (``pairs``, all Lanczos) at ``timing``: the loop path
    prices every product at its item's milliseconds, the batched path the Lanczos products by
    :func:`lockstep_item_seconds` and the rest at the item's milliseconds; each Lanczos
    product adds its item's ``step_ms`` (the iteration's own cost). (None, None)
    without a timing: every product at ``ms``."""
    if timing is None:
        return None, None

    def item_ms(key: str) -> float:
        return float(timing.item_ms.get(key, ms))

    def step(key: str, products: float) -> float:  # the iteration's own cost
        return products * float(timing.step_ms.get(key, 0.0)) / 1000.0

    if timing.batched:
        lock = lockstep_item_seconds({**lanczos, **pairs}, timing)
        blocks = {
            k: lock[k] + step(k, lanczos[k]) + (block_total[k] - lanczos[k]) * item_ms(k) / 1000.0
            for k in block_total
        }
        return blocks or None, {k: lock[k] + step(k, pairs[k]) for k in pairs} or None
    blocks = {k: block_total[k] * item_ms(k) / 1000.0 + step(k, lanczos[k]) for k in block_total}
    return blocks or None, {
        k: p * item_ms(k) / 1000.0 + step(k, p) for k, p in pairs.items()
    } or None


def noise_split(n_examples: int, opts: CostOptions) -> tuple[int, int, int, int]:
    """(gradient examples, Hessian examples, gradient groups k, Hessian groups) of the
    gradient-noise statistics on N examples (the fixed split of ``gradient_noise_from_sample``;
    :func:`noise_cost`): the Hessian forms make one product per gradient group and Hessian
    group, k times the groups."""
    n = max(int(n_examples), 3)
    grads = int(opts.noise_grad_examples or min(n // 2, NOISE_MAX_EXAMPLES))
    grads = max(2, min(grads, n - 1))
    hessian = int(opts.noise_hessian_examples or min(n - grads, NOISE_MAX_EXAMPLES))
    hessian = max(1, min(hessian, n - grads))
    size, cap = 1, max(int(opts.noise_max_groups), 4)
    while math.ceil(grads / size) > cap:  # full groups merge pairwise: their size doubles
        size *= 2
    return grads, hessian, math.ceil(grads / size), min(NOISE_HESSIAN_GROUPS, hessian)


def noise_cost(
    n_examples: int, opts: CostOptions, ms: float, example: Mapping[str, Any] | None
) -> tuple[float, float | None]:
    """(products, seconds) of the gradient-noise statistics (``curvature/gradient_noise.py``,
    McCandlish et al. 2018 §2.2). The sample splits into g = ``noise_grad_examples`` (default
    min(N/2, 64)) gradient examples and h = ``noise_hessian_examples`` (default min(N − g, 64))
    Hessian examples; the g per-example gradients go into k ≤ ``noise_max_groups`` groups
    (``noise_stream``: full groups merge pairwise), and each of the
    :data:`NOISE_HESSIAN_GROUPS` groups of the Hessian batch (m = h / 4 examples) takes one
    Hessian-vector product per gradient group, on its own graph (:func:`noise_split`). Profiled
    on the example and the tiny GPT-2 (2026-12-03), those products are ≥ 97 % of the stage.

    Products: 4k HVPs on m examples, each m / N of a product plus :data:`PER_EXAMPLE_OVERHEAD`,
    and the g per-example gradients, each 1 / N plus the same overhead. Seconds, with the
    one-example timing (``example``: ``warm_ms``, ``first_ms``): an HVP on m examples costs the
    line through the one-example product (m = 1) and the whole sample's (m = N, ``ms``), each
    group's first product builds its graph (``first_ms`` − ``warm_ms``), and a per-example
    gradient costs about a one-example product (vmapped: 0.49 s against 0.32 s on the 19.5 M
    Llama). None without the timing: products × ``ms``."""
    grads, hessian, k, groups = noise_split(n_examples, opts)
    n = max(int(n_examples), 3)
    m = hessian / groups
    products = groups * k * (m / n + PER_EXAMPLE_OVERHEAD) + grads * (1 / n + PER_EXAMPLE_OVERHEAD)
    if not example or example.get("warm_ms") is None:
        return products, None
    warm = float(example["warm_ms"])
    first = float(example.get("first_ms") or warm)
    per_example = max(ms - warm, 0.0) / (n - 1)  # the line through (1, warm) and (N, ms)
    hvp = warm + (m - 1.0) * per_example
    seconds = groups * (k * hvp + max(first - warm, 0.0)) + grads * warm
    return products, seconds / 1000.0


def per_sample_seconds(
    subsample: int, opts: CostOptions, example: Mapping[str, Any] | None
) -> float | None:
    """Seconds of the per-sample Hessian norms from a timed one-example product: each of the
    ``subsample`` examples runs its own Lanczos of s = min(per_sample_max_iter,
    :data:`PER_SAMPLE_STEPS`) products on its own engine, the first building the example's
    graph: subsample · (first + (s − 1) · warm + s · step) ms. None without the timing."""
    if not example or example.get("warm_ms") is None:
        return None
    steps = float(min(opts.per_sample_max_iter, PER_SAMPLE_STEPS))
    first = float(example.get("first_ms") or example["warm_ms"])
    warm = float(example["warm_ms"])
    step = float(example.get("step_ms") or 0.0)
    return subsample * (first + (steps - 1.0) * warm + steps * step) / 1000.0


TRAINING_FLOPS_PER_PARAM_TOKEN = 6.0
"""FLOPs of one training step per parameter and token: forward 2PT and backward 4PT (Kaplan et
al. 2020, §2.1, C ≈ 6N per token)."""


def training_seconds(n_params: int, tokens_per_example: float, examples: float) -> float:
    """Seconds to train on ``examples`` examples before anything is measured: 6 · P · T FLOPs
    per example (Kaplan et al. 2020, §2.1) at :data:`PRIOR_FLOPS_PER_SECOND` (the prior of
    :func:`prior_ms_per_product`; evaluations not included)."""
    flops = TRAINING_FLOPS_PER_PARAM_TOKEN * max(n_params, 1) * max(tokens_per_example, 1.0)
    return flops * max(examples, 0.0) / PRIOR_FLOPS_PER_SECOND


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
