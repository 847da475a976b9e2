"""Extreme eigenvalues of symmetric operators by thick-restart Lanczos in a bounded basis.

λ_max and λ_min are both read from one Krylov space and each is certified separately by its
explicit residual ‖Hy − θy‖ ≤ tol·max(|θ|, floor·‖H‖) (docs/numerics.md#lanczos: power iteration
returns the largest *magnitude*; stop on residuals, surface ``converged`` and the number of
products). By the Bauer–Fike theorem for symmetric matrices a residual r certifies an eigenvalue
within r of θ (Parlett, "The Symmetric Eigenvalue Problem", Thm 4.5.1 / §13.2 for Lanczos).

The basis is bounded (docs/numerics.md#bounded-basis): at most :func:`basis_vectors` vectors
(32, fewer where ``basis_budget`` bytes cannot hold 32 of the operator's size, more for a small
operator: up to 16 MiB of them, at most 320), in float32 on the
product's device, float64 only in strict precision (float64 products). When it is full the
iteration restarts from the wanted Ritz vectors and the residual vector: thick-restart Lanczos
(Wu & Simon 2000, "Thick-restart Lanczos method for large symmetric eigenvalue problems", SIAM
J. Matrix Anal. Appl. 22(2), §3, eqs. (3.1)–(3.4): after a restart H Q_k = Q_k Θ_k +
q_{k+1} sᵀ, so the projected matrix is an arrowhead diag(Θ_k) bordered by s = β_m S[m, kept],
continued tridiagonally). Every vector is reorthogonalised twice against the whole basis.

The iteration is a coroutine (:func:`lanczos_steps`) that yields the vectors it needs multiplied
and receives the products, so one loop can drive it with a plain mat-vec
(:func:`lanczos_spectrum`) and another can advance many blocks together, one batched product per
step (``lockstep.py``); both run the same arithmetic on the same seeded start vectors.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from curvplan_core.cost_model import basis_bytes as basis_bytes
from curvplan_core.cost_model import basis_vectors
from curvplan_worker.curvature.cancel import check_cancel

MatVec = Callable[[Tensor], Tensor]
Trace = Callable[[dict], None]
"""Receives one record per Lanczos step and per certification check (``lanczos_steps``)."""

DEFAULT_MAX_ITER = 500
"""Lanczos steps when the caller sets no ``max_iter``."""


@dataclass
class EigenEnd:
    """One certified Ritz pair."""

    value: float
    residual: float
    converged: bool
    vector: Tensor | None = None
    scale: float = 1.0  # the certification scale max(|θ|, floor·‖H‖)


@dataclass
class Spectrum:
    """Result of :func:`lanczos_spectrum` for one symmetric operator.

    ``restarts`` counts the thick restarts of the bounded basis (``basis_vectors`` vectors);
    ``restarts_for_min`` those made after λ_max's recurrence estimate had already passed its
    tolerance: what the bounded basis costs λ_min (docs/numerics.md#bounded-basis).
    """

    lambda_max: float
    lambda_min: float
    converged: bool
    n_products: int
    iterations: int
    residual_max: float
    residual_min: float
    tolerance: float
    top: list[EigenEnd] = field(default_factory=list)
    scale_max: float = 1.0
    scale_min: float = 1.0
    precision_limited: bool = False
    restarts: int = 0
    restarts_for_min: int = 0
    basis_vectors: int = 0

    @property
    def worst_failing_residual(self) -> float:
        """The largest residual among the pairs above their tolerance (0 when none is): what
        the stagnation test compares with the rounding level (a certified pair's residual,
        which a later check may not re-measure, says nothing about the failing one)."""
        parts = [
            (self.residual_max, self.scale_max),
            (self.residual_min, self.scale_min),
            *((e.residual, e.scale) for e in self.top),
        ]
        failing = [r for r, scale in parts if r == r and r > self.tolerance * scale]
        return max(failing, default=0.0)

    @property
    def worst_relative_residual(self) -> float:
        """max over the certified pairs of residual / (tol-scale), i.e. the attained tolerance."""
        parts = [self.residual_max / self.scale_max, self.residual_min / self.scale_min]
        parts += [e.residual / e.scale for e in self.top]
        return max(p for p in parts if p == p) if any(p == p for p in parts) else float("nan")

    @property
    def spectral_norm(self) -> float:
        return max(abs(self.lambda_max), abs(self.lambda_min))

    def as_dict(self) -> dict:
        out = {
            "lambda_max": self.lambda_max,
            "lambda_min": self.lambda_min,
            "spectral_norm": self.spectral_norm,
            "converged": self.converged,
            "n_products": self.n_products,
            "iterations": self.iterations,
            "residual": max(self.residual_max, self.residual_min),
            "residual_max": self.residual_max,
            "residual_min": self.residual_min,
            "tolerance": self.tolerance,
            "attained_tolerance": self.worst_relative_residual,
            "precision_limited": self.precision_limited,
            "basis_vectors": self.basis_vectors,
            "restarts": self.restarts,
            "restarts_for_min": self.restarts_for_min,
        }
        if self.top:
            out["top_k"] = [
                {"value": e.value, "residual": e.residual, "converged": e.converged}
                for e in self.top
            ]
        return out


Steps = Generator[Tensor, Tensor, Spectrum]
"""A Lanczos coroutine: yields a vector to multiply, is sent its product, returns the result."""

_CHUNK = 1 << 20
"""Elements per chunk of the float64 reductions and the in-place restart rotation."""


def _random_unit(n: int, generator: torch.Generator) -> Tensor:
    v = torch.randn(n, generator=generator, dtype=torch.float64)
    return v / torch.linalg.vector_norm(v)


def _dot(a: Tensor, b: Tensor) -> float:
    """a·b accumulated in float64 (in chunks, so a float32 basis needs no full-size copy)."""
    if a.dtype == torch.float64 and b.dtype == torch.float64:
        return float(torch.dot(a, b))
    total = 0.0
    for s in range(0, a.numel(), _CHUNK):
        total += float(torch.dot(a[s : s + _CHUNK].double(), b[s : s + _CHUNK].double()))
    return total


def _residual_norm(hy: Tensor, lam: float, y: Tensor) -> float:
    """‖hy − λy‖ in float64."""
    if hy.dtype == torch.float64 and y.dtype == torch.float64:
        return float(torch.linalg.vector_norm(hy - lam * y))
    total = 0.0
    for s in range(0, y.numel(), _CHUNK):
        r = hy[s : s + _CHUNK].double() - lam * y[s : s + _CHUNK].double()
        total += float(r @ r)
    return math.sqrt(total)


def _rotate(basis: Tensor, rows: int, coefficients: np.ndarray) -> None:
    """basis[:k] ← Yᵀ basis[:rows] in place (Y = ``coefficients``, rows × k), column chunk by
    column chunk, so the restart holds no second basis."""
    y = torch.from_numpy(np.ascontiguousarray(coefficients.T)).to(basis.device, basis.dtype)
    k = y.shape[0]
    for s in range(0, basis.shape[1], _CHUNK):
        block = basis[:rows, s : s + _CHUNK]
        basis[:k, s : s + _CHUNK] = y @ block


def _wanted_counts(ends: Sequence[str], top_k: int) -> tuple[int, int]:
    """(Ritz values wanted at the top, at the bottom)."""
    top = max(1 if "max" in ends else 0, top_k)
    return top, 1 if "min" in ends else 0


def _kept(
    m: int, ends: Sequence[str], top_k: int, done_top: bool = False, done_bottom: bool = False
) -> list[int]:
    """Indices (into ascending Ritz values of an m × m projection) kept at a thick restart:
    half the basis, the wanted ones always included, the rest near the wanted ends (Wu & Simon
    2000 §4 keep the Ritz pairs nearest the wanted end); once one end's estimate has passed
    its tolerance (``done_top``/``done_bottom``) it keeps only its wanted vectors and the
    other end, still converging, gets the spare ones."""
    need_top, need_bottom = _wanted_counts(ends, top_k)
    kept = min(m - 2, max(need_top + need_bottom, m // 2))
    if need_top and need_bottom:
        if done_top and not done_bottom:
            bottom = kept - need_top
        elif done_bottom and not done_top:
            bottom = need_bottom
        else:
            bottom = max(need_bottom, min(kept - need_top, kept // 2))
        top = kept - bottom
    elif need_top:
        top, bottom = kept, 0
    else:
        top, bottom = 0, kept
    return list(range(bottom)) + list(range(m - top, m))


def lanczos_steps(
    n: int,
    *,
    generator: torch.Generator,
    tol: float = 1e-6,
    max_iter: int | None = None,
    top_k: int = 0,
    ends: tuple[str, ...] = ("max", "min"),
    floor: float = 1e-3,
    want_vectors: bool = False,
    basis: int | None = None,
    basis_budget: int | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float64,
    trace: Trace | None = None,
) -> Steps:
    """Thick-restart Lanczos (Wu & Simon 2000, eqs. (3.1)–(3.4)) as a coroutine.

    Yields vectors (``dtype`` on ``device``, shape (n,)) and expects H·v back (any float dtype,
    any device). The basis holds ``basis`` vectors (default :func:`basis_vectors` of
    ``basis_budget``); each new vector is orthogonalised twice against all of them (Parlett
    §6.9). Stops when every requested Ritz pair (``ends`` and the ``top_k`` largest) passes its
    *explicit* residual test ‖Hy − θy‖ ≤ tol·max(|θ|, floor·max|θ|); the explicit checks are
    yielded too and counted in ``n_products``. An invariant Krylov subspace (β ≈ 0) ends the
    iteration early with exact Ritz values. ``converged`` is False when ``max_iter`` steps
    (default 500; the certification products are not steps) do not certify them, or when the
    explicit residual stagnates above the tolerance while the recurrence says converged
    (``precision_limited``: the products' rounding noise, typically float32, is above
    tol·scale; ``attained_tolerance`` then says what was certified).

    ``trace``, when given, receives after every step the extreme Ritz values and their
    recurrence residuals β|s_k| (``step``, ``basis``, ``restarts``, ``theta_max``, ``theta_min``,
    ``rho_max``, ``rho_min``) and after every certification check its outcome (``check``:
    True, ``lambda_max``, ``lambda_min``, ``residual_max``, ``residual_min``, ``products``,
    ``converged``): what ``benchmarks/bench_lanczos_trace.py`` prints.
    """
    if n <= 0:
        raise ValueError("empty operator")
    need_top, need_bottom = _wanted_counts(ends, top_k)
    itemsize = torch.empty((), dtype=dtype).element_size()
    wanted = need_top + need_bottom
    m = basis if basis is not None else basis_vectors(n, basis_budget, itemsize, wanted)
    m = min(int(m), n + 1)
    if m <= n and m < need_top + need_bottom + 2:
        raise ValueError(
            f"a basis of {m} vectors cannot keep {need_top + need_bottom} Ritz vectors and grow"
        )
    device = torch.device(device) if device is not None else torch.device("cpu")
    step_limit = int(max_iter or DEFAULT_MAX_ITER)
    q_basis = torch.zeros(m, n, dtype=dtype, device=device)
    q_basis[0] = _random_unit(n, generator).to(device, dtype)
    t = np.zeros((m, m))
    j = 0  # index of the newest basis vector
    steps = restarts = n_products = 0
    max_ready_at: int | None = None  # restarts made when λ_max's estimate first passed
    next_check, next_periodic = 0, 20
    previous_failure: float | None = None
    stagnant = 0
    certified: dict[str, EigenEnd] = {}  # ends an explicit check has certified
    result: Spectrum | None = None
    while True:
        check_cancel("lanczos")
        w = (yield q_basis[j]).detach()
        noise_level = 30 * torch.finfo(w.dtype).eps  # residual/‖H‖ at the rounding level
        w = w.to(device, dtype).reshape(-1)
        steps += 1
        n_products += 1
        index = steps - 1
        t[j, j] = _dot(q_basis[j], w)
        coupling = torch.from_numpy(t[: j + 1, j].copy()).to(device, dtype)
        w = w - coupling @ q_basis[: j + 1]
        for _ in range(2):  # full reorthogonalisation, twice is enough (Parlett §6.9)
            w = w - (q_basis[: j + 1] @ w) @ q_basis[: j + 1]
        beta = math.sqrt(max(_dot(w, w), 0.0))
        theta, s = _ritz(t[: j + 1, : j + 1], (need_top, need_bottom) if restarts == 0 else None)
        norm_est = max(abs(theta[0]), abs(theta[-1]), 1e-300)
        full_space = restarts == 0 and j + 1 == n
        invariant = beta <= 1e-13 * norm_est * max(1.0, np.sqrt(n)) or full_space
        exhausted = steps >= step_limit
        wanted = _wanted(theta, ends, top_k)
        if trace is not None:
            trace(
                {
                    "step": steps,
                    "basis": j + 1,
                    "restarts": restarts,
                    "theta_max": float(theta[-1]),
                    "theta_min": float(theta[0]),
                    "rho_max": beta * abs(float(s[-1, -1])),
                    "rho_min": beta * abs(float(s[-1, 0])),
                }
            )

        def estimate_ok(i: int, theta=theta, s=s, beta=beta, norm_est=norm_est) -> bool:
            return beta * abs(s[-1, i]) <= tol * max(abs(theta[i]), floor * norm_est)

        if "max" in ends and max_ready_at is None and estimate_ok(len(theta) - 1):
            max_ready_at = restarts
        estimates_ok = all(estimate_ok(i) for i in wanted)
        periodic = index >= next_periodic
        if (estimates_ok and index >= next_check) or periodic or invariant or exhausted:
            result = yield from _certify_steps(
                q_basis[: j + 1], theta, s, ends, top_k, tol, floor, want_vectors, certified
            )
            n_products += result.n_products
            result.iterations = steps
            if trace is not None:
                trace(
                    {
                        "step": steps,
                        "check": True,
                        "lambda_max": result.lambda_max,
                        "lambda_min": result.lambda_min,
                        "residual_max": result.residual_max,
                        "residual_min": result.residual_min,
                        "scale_max": result.scale_max,
                        "scale_min": result.scale_min,
                        "products": result.n_products,
                        "converged": result.converged,
                    }
                )
            if result.converged or invariant or exhausted:
                break
            # Not certified yet. When the residual stops improving at the products' rounding
            # level (e.g. float32), more steps cannot help: re-check with growing gaps and stop
            # when two further checks do not halve it (converged stays False, honestly).
            worst = result.worst_relative_residual
            at_noise = result.worst_failing_residual <= noise_level * norm_est
            if previous_failure is not None and worst > 0.5 * previous_failure and at_noise:
                stagnant += 1
            else:
                stagnant = 0
            previous_failure = worst if previous_failure is None else min(previous_failure, worst)
            if stagnant >= 2:
                result.precision_limited = True
                break
            next_check = index + max(3, steps // 4)
            next_periodic = index + max(10, steps // 2)
        if beta == 0.0:
            break
        if j + 1 == m:  # the basis is full: thick restart from the kept Ritz vectors
            if np.isnan(theta).any():  # the step computed the wanted pairs only
                theta, s = _ritz(t[: j + 1, : j + 1])  # every pair: the kept ones rotate in
            done_top = need_top > 0 and all(
                estimate_ok(len(theta) - 1 - i) for i in range(min(need_top, len(theta)))
            )
            done_bottom = need_bottom > 0 and estimate_ok(0)
            kept = _kept(m, ends, top_k, done_top, done_bottom)
            _rotate(q_basis, m, s[:, kept])
            k = len(kept)
            q_basis[k] = w / beta
            border = beta * s[-1, kept]
            t[:] = 0.0
            t[np.arange(k), np.arange(k)] = theta[kept]
            t[k, :k] = border
            t[:k, k] = border
            j = k
            restarts += 1
        else:
            t[j + 1, j] = t[j, j + 1] = beta
            q_basis[j + 1] = w / beta
            j += 1
    assert result is not None
    result.n_products = n_products
    result.restarts = restarts
    result.basis_vectors = m
    if "min" in ends and max_ready_at is not None:
        result.restarts_for_min = restarts - max_ready_at
    return result


def drive(steps: Generator[Tensor, Tensor, Spectrum], matvec: MatVec) -> Spectrum:
    """Run a Lanczos coroutine to the end with ``matvec`` (one product at a time)."""
    try:
        vector = next(steps)
        while True:
            vector = steps.send(matvec(vector))
    except StopIteration as stop:
        return stop.value


def lanczos_spectrum(
    matvec: MatVec,
    n: int,
    *,
    generator: torch.Generator,
    tol: float = 1e-6,
    max_iter: int | None = None,
    top_k: int = 0,
    ends: tuple[str, ...] = ("max", "min"),
    floor: float = 1e-3,
    want_vectors: bool = False,
    basis: int | None = None,
    basis_budget: int | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float64,
) -> Spectrum:
    """Thick-restart Lanczos for the extreme eigenvalues of a symmetric operator
    (:func:`lanczos_steps`, driven with ``matvec``; Wu & Simon 2000, eqs. (3.1)–(3.4)).

    ``matvec`` maps a vector (n,) of ``dtype`` on ``device`` (default float64 on the CPU) to
    H·v (any float dtype, any device).
    """
    return drive(
        lanczos_steps(
            n,
            generator=generator,
            tol=tol,
            max_iter=max_iter,
            top_k=top_k,
            ends=ends,
            floor=floor,
            want_vectors=want_vectors,
            basis=basis,
            basis_budget=basis_budget,
            device=device,
            dtype=dtype,
        ),
        matvec,
    )


REUSE_WINDOW = 0.1
"""A certified end is carried over to a later check while its Ritz value has moved by at most
its certificate's residual or this share of the tolerance (the Ritz values of a converged end
still jitter at the rounding level of the restarts' rotations, above a tiny residual)."""

TRIDIAGONAL_FAST_FROM = 64
"""Above this size an unrestarted (tridiagonal) projection's wanted Ritz pairs come from
``eigh_tridiagonal`` (O(size) a pair) instead of a full ``eigh`` (O(size³): 7 ms at 256, 39 ms
at 512, more than a small block's product)."""


def _ritz(
    t: np.ndarray, tridiagonal_wanted: tuple[int, int] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Eigenpairs (ascending) of the small symmetric projection T.

    ``tridiagonal_wanted`` = (top, bottom) says T is tridiagonal (no restart yet) and only the
    ``top`` largest and ``bottom`` smallest pairs are needed: above
    :data:`TRIDIAGONAL_FAST_FROM` only those are computed (the other values are NaN and their
    vectors zero; a restart asks for every pair)."""
    from curvplan_worker.curvature.device import pinned_blas_threads

    size = t.shape[0]
    if size == 1:
        return t[0].copy(), np.ones((1, 1))
    if tridiagonal_wanted is not None and size > TRIDIAGONAL_FAST_FROM:
        from scipy.linalg import eigh_tridiagonal

        top, bottom = tridiagonal_wanted
        diagonal, off = np.diagonal(t).copy(), np.diagonal(t, 1).copy()
        theta = np.full(size, np.nan)
        s = np.zeros((size, size))
        for lo, hi in ((0, bottom - 1), (size - top, size - 1)):
            if hi < lo:
                continue
            values, vectors = eigh_tridiagonal(
                diagonal, off, select="i", select_range=(lo, hi), lapack_driver="stemr"
            )
            theta[lo : hi + 1] = values
            s[:, lo : hi + 1] = vectors
        return theta, s
    with pinned_blas_threads(1):
        theta, s = np.linalg.eigh(t)
    return theta, s


def _wanted(theta: np.ndarray, ends: tuple[str, ...], top_k: int) -> list[int]:
    m = len(theta)
    idx: list[int] = []
    if "max" in ends:
        idx.append(m - 1)
    if "min" in ends:
        idx.append(0)
    for i in range(min(top_k, m)):
        idx.append(m - 1 - i)
    return sorted(set(idx))


def _certify_steps(
    basis: Tensor,
    theta: np.ndarray,
    s: np.ndarray,
    ends: tuple[str, ...],
    top_k: int,
    tol: float,
    floor: float,
    want_vectors: bool,
    certified: dict[str, EigenEnd] | None = None,
) -> Generator[Tensor, Tensor, Spectrum]:
    """Explicit residuals of the wanted Ritz pairs: one yielded product each.

    ``certified`` holds the ends ("max", "min") an earlier pass certified; an end whose Ritz
    value still lies within that certificate's residual, or :data:`REUSE_WINDOW` of its
    tolerance, of the certified value is the same eigenpair and is not multiplied again (its
    certificate stands, and the value reported is within 1.1 tolerances of the latest Ritz
    value); newly certified ends are added to it. Not with ``want_vectors`` or ``top_k`` > 1:
    the vectors of a set must be orthogonal, i.e. come from one Rayleigh–Ritz."""
    norm_est = max(abs(theta[0]), abs(theta[-1]), 1e-300)
    checked: dict[int, EigenEnd] = {}
    products = 0
    m = len(theta)
    if want_vectors or top_k > 1:  # a set of vectors must come from one Rayleigh–Ritz
        certified = None
    for i in _wanted(theta, ends, top_k):
        end = "max" if i == m - 1 else "min" if i == 0 else None
        held = certified.get(end) if certified is not None and end and m > 1 else None
        if held is not None and abs(theta[i] - held.value) <= max(
            held.residual, REUSE_WINDOW * tol * held.scale
        ):
            checked[i] = held
            continue
        coefficients = torch.from_numpy(np.ascontiguousarray(s[:, i])).to(basis.device, basis.dtype)
        y = coefficients @ basis
        y = y / math.sqrt(_dot(y, y))
        hy = (yield y).detach().reshape(-1)
        products += 1
        hy = hy.to(y.device)
        lam = _dot(y, hy)  # Rayleigh quotient of the normalised Ritz vector
        res = _residual_norm(hy, lam, y)
        scale = max(abs(lam), floor * norm_est, 1e-300)
        ok = res <= tol * scale
        vector = y.to("cpu", torch.float64) if want_vectors else None
        checked[i] = EigenEnd(lam, res, ok, vector, scale)
        if ok and end and certified is not None and m > 1:
            certified[end] = checked[i]
    top = [checked[m - 1 - i] for i in range(min(top_k, m))]
    hi = checked.get(m - 1)
    lo = checked.get(0)
    return Spectrum(
        lambda_max=hi.value if hi else float("nan"),
        lambda_min=lo.value if lo else float("nan"),
        converged=all(e.converged for e in checked.values()),
        n_products=products,
        iterations=0,
        residual_max=hi.residual if hi else float("nan"),
        residual_min=lo.residual if lo else float("nan"),
        tolerance=tol,
        top=top,
        scale_max=hi.scale if hi else 1.0,
        scale_min=lo.scale if lo else 1.0,
    )


# ---------------------------------------------------------------------------------------------
# Hessian blocks and off-diagonal pairs of a CurvatureEngine
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Product:
    """One Hessian product a block or pair coroutine asks for: H[rows, cols] · vector."""

    rows: tuple[str, ...]
    cols: tuple[str, ...]
    vector: Tensor


ProductSteps = Generator[Product, Tensor, object]
"""A coroutine over Hessian products (:func:`block_steps`, :func:`pair_steps`)."""


def basis_dtype(product_dtype: torch.dtype) -> torch.dtype:
    """The basis precision: float64 only for float64 (strict) products, else float32."""
    return torch.float64 if product_dtype == torch.float64 else torch.float32


def _as_products(
    inner: Steps, rows: tuple[str, ...], cols: tuple[str, ...]
) -> Generator[Product, Tensor, Spectrum]:
    try:
        vector = next(inner)
        while True:
            vector = inner.send((yield Product(rows, cols, vector)))
    except StopIteration as stop:
        return stop.value


def block_steps(
    engine,
    names: Sequence[str],
    *,
    generator: torch.Generator,
    tol: float = 1e-6,
    max_iter: int | None = None,
    top_k: int = 0,
    floor: float = 1e-3,
    want_vectors: bool = False,
    basis_budget: int | None = None,
    trace: Trace | None = None,
) -> Generator[Product, Tensor, Spectrum]:
    """The coroutine of :func:`block_spectrum`: yields the block products H_BB v it needs.

    The start vector is drawn from ``generator`` when the coroutine is first advanced."""
    names = tuple(names)
    inner = lanczos_steps(
        engine.layout(names).numel,
        generator=generator,
        tol=tol,
        max_iter=max_iter,
        top_k=top_k,
        floor=floor,
        want_vectors=want_vectors,
        basis_budget=basis_budget,
        device=engine.device,
        dtype=basis_dtype(engine.dtype),
        trace=trace,
    )
    return (yield from _as_products(inner, names, names))


def run_products(steps: ProductSteps, engine) -> object:
    """Run a product coroutine to the end, one ``engine.hvp`` per product (sequentially)."""
    try:
        product = next(steps)
        while True:
            product = steps.send(engine.hvp(product.rows, product.cols, product.vector))
    except StopIteration as stop:
        return stop.value


def block_spectrum(
    engine,
    names: list[str],
    *,
    generator: torch.Generator,
    tol: float = 1e-6,
    max_iter: int | None = None,
    top_k: int = 0,
    floor: float = 1e-3,
    want_vectors: bool = False,
    basis_budget: int | None = None,
    trace: Trace | None = None,
) -> Spectrum:
    """λ_max, λ_min (and top-k) of the diagonal Hessian block H_BB of ``names`` (thick-restart
    Lanczos, Wu & Simon 2000; the basis on the engine's device, :func:`basis_dtype`)."""
    steps = block_steps(
        engine,
        names,
        generator=generator,
        tol=tol,
        max_iter=max_iter,
        top_k=top_k,
        floor=floor,
        want_vectors=want_vectors,
        basis_budget=basis_budget,
        trace=trace,
    )
    result = run_products(steps, engine)
    assert isinstance(result, Spectrum)
    return result


@dataclass
class SingularValue:
    """σ_max of an off-diagonal block, from Lanczos on H_ijᵀ H_ij."""

    sigma_max: float
    converged: bool
    n_products: int
    residual: float
    precision_limited: bool = False
    restarts: int = 0
    basis_vectors: int = 0

    def as_dict(self) -> dict:
        return {
            "sigma_max": self.sigma_max,
            "converged": self.converged,
            "n_products": self.n_products,
            "residual": self.residual,
            "precision_limited": self.precision_limited,
            "basis_vectors": self.basis_vectors,
            "restarts": self.restarts,
        }


def pair_steps(
    engine,
    rows: Sequence[str],
    cols: Sequence[str],
    *,
    generator: torch.Generator,
    tol: float = 1e-6,
    max_iter: int | None = None,
    basis_budget: int | None = None,
) -> Generator[Product, Tensor, SingularValue]:
    """The coroutine of :func:`off_diagonal_norm`: each operator step yields H_ij v, then
    H_ji u = H_ijᵀ u."""
    rows, cols = tuple(rows), tuple(cols)
    inner = lanczos_steps(
        engine.layout(cols).numel,
        generator=generator,
        tol=tol,
        max_iter=max_iter,
        ends=("max",),
        basis_budget=basis_budget,
        device=engine.device,
        dtype=basis_dtype(engine.dtype),
    )
    try:
        vector = next(inner)
        while True:
            u = yield Product(rows, cols, vector)
            vector = inner.send((yield Product(cols, rows, u)))
    except StopIteration as stop:
        spec = stop.value
    return SingularValue(
        sigma_max=float(np.sqrt(max(spec.lambda_max, 0.0))),
        converged=spec.converged,
        n_products=2 * spec.n_products,
        residual=spec.residual_max,
        precision_limited=spec.precision_limited,
        restarts=spec.restarts,
        basis_vectors=spec.basis_vectors,
    )


def off_diagonal_norm(
    engine,
    rows: list[str],
    cols: list[str],
    *,
    generator: torch.Generator,
    tol: float = 1e-6,
    max_iter: int | None = None,
    basis_budget: int | None = None,
) -> SingularValue:
    """σ_max(H_ij) = sqrt(λ_max(H_ijᵀ H_ij)); each operator product costs two Hessian products
    (H_ij v, then H_ji u = H_ijᵀ u), as in docs/formulas.md#curvature."""
    steps = pair_steps(
        engine,
        rows,
        cols,
        generator=generator,
        tol=tol,
        max_iter=max_iter,
        basis_budget=basis_budget,
    )
    result = run_products(steps, engine)
    assert isinstance(result, SingularValue)
    return result
