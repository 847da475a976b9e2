"""Could a probabilistic certificate over the random start vector stop Lanczos earlier than the
residual test (docs/numerics.md#lanczos)? Measured, step by step, on the engine's own Lanczos.

The identity (exact arithmetic): a Lanczos run from the unit start vector b with projection T_k
(Ritz values θ_j) and last coupling β_k has χ_k(H) b = (β_1⋯β_k) q_{k+1}, χ_k(x) = Π (x − θ_j).
So every eigenpair (λ_i, u_i) with c_i = u_iᵀb has |c_i χ_k(λ_i)| ≤ β_1⋯β_k = G. For the top
end χ_k increases beyond θ_max ≤ λ_max: if c_1² > t0 then λ_max ≤ x*, the root above θ_max of
|χ_k(x)| = G/√t0 (the bottom end likewise). For b uniform on the sphere (the engine normalises a
Gaussian draw), c_1² ~ Beta(1/2, (n−1)/2) (the projection on a multiple top eigenspace is
larger still), so t0 = the Beta quantile at δ makes λ_max − θ_max ≤ x* − θ_max hold with
probability ≥ 1 − δ, at every step at once (the event c_1² ≤ t0 does not depend on the step).

After a thick restart (Wu & Simon 2000; exact shifts at the discarded Ritz values, Sorensen
1992) the basis is the Krylov space of v+ = ψ(H) w / ‖ψ(H) w‖, ψ(x) = Π_discarded (x − θ_j),
w the cycle's start vector; so the polynomial gains ψ's roots and G the factor ‖ψ(H) w‖ =
‖ψ(Θ_kept) S_keptᵀ z‖ (z: w in the cycle's basis). Within a cycle of size p the factor γ with
χ_T(H) v = γ q_next is computed from the Jacobi-matrix identity w_i(1) w_i(p) χ_T'(θ_i) =
Π β̃ as γ = ρ_i |(Sᵀz)_i| Π_{j≠i} |θ_i − θ_j| (ρ_i = β |s_{p,i}|, the recurrence residual),
i the end whose ρ_i is not rounding (the larger |s_{p,i}|); before the first restart directly
as γ = β_1⋯β_k. Everything is in log space (Π β under/overflows).

The script follows ``spectra.lanczos_steps`` unchanged: its ``trace`` gives θ and ρ per step;
the projection T_k it passes to ``_ritz`` and the kept Ritz coefficients it passes to
``_rotate`` at a restart are recorded by wrapping those two helpers (their results untouched).
It runs each operator to ``tol × --run-tol-factor`` so that criteria later than the residual
stop are seen, and prints per block and end the first step at which

* ``eig``: the true error |θ − λ| ≤ tol·max(|λ|, floor·‖H‖) (dense eigenvalues; on the HF GPT-2
  blocks a reference run at ``--reference-tol``, as ``bench_lanczos_trace.py``);
* ``res``: the recurrence residual ρ ≤ tol·max(|θ|, floor·max|θ|) (the engine's stop test,
  then confirmed by an explicit product);
* ``p<δ>``: the probabilistic bound x* − θ ≤ tol·max(|θ|, floor·max|θ|), per δ.

On the dense oracles (every block of the bundled example, float32 and float64 products; every
block of the tiny engine-test models; the hard spectra of ``tests/curvature/test_error_bound.py``
with the default and a 12-vector restarted basis) it also checks at every step, end and δ that
the true error is within the bound (plus the products' rounding allowance, 30·eps·‖H‖ in
float32, 1e-11·‖H‖ in float64) and counts violations.

    OMP_NUM_THREADS=1 nice .venv/bin/python benchmarks/bench_lanczos_certificate.py \
        [--part identity|oracles|gpt2|all]
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from scipy.stats import beta as beta_distribution

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from curvplan_worker.curvature import spectra  # noqa: E402

END_NAMES = ("max", "min")


def log_t0(n: int, delta: float) -> float:
    """log of the δ-quantile of c² ~ Beta(1/2, (n−1)/2), the squared projection of a uniform
    unit vector in R^n on a fixed direction."""
    if n <= 1:
        return 0.0
    return math.log(float(beta_distribution.ppf(delta, 0.5, (n - 1) / 2)))


def _log_abs_poly(x: float, roots: np.ndarray) -> float:
    with np.errstate(divide="ignore"):
        return float(np.sum(np.log(np.abs(x - roots))))


def root_beyond(roots: np.ndarray, target: float, upward: bool) -> float:
    """Distance d ≥ 0 from the outermost root to the x beyond it where log|Π(x − r)| = target
    (bisection on log d; the left side increases from −∞ in d)."""
    edge = float(roots.max() if upward else roots.min())
    sign = 1.0 if upward else -1.0
    if not math.isfinite(target):
        return 0.0 if target < 0 else math.inf
    span = max(float(roots.max() - roots.min()), abs(edge), 1e-300)
    lo, hi = math.log(span) - 80.0, math.log(span) + 2.0
    while _log_abs_poly(edge + sign * math.exp(hi), roots) < target:
        hi += 5.0
    if _log_abs_poly(edge + sign * math.exp(lo), roots) >= target:
        return 0.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if _log_abs_poly(edge + sign * math.exp(mid), roots) < target:
            lo = mid
        else:
            hi = mid
    return math.exp(hi)


@dataclass
class StepBound:
    step: int
    theta: tuple[float, float]  # (θ_max, θ_min)
    rho: tuple[float, float]
    scale: tuple[float, float]  # tol-scale max(|θ|, floor·max|θ|) per end
    bound: dict[float, tuple[float, float]]  # δ → (x*_max − θ_max, θ_min − x*_min)
    gamma_spread: float  # |log γ(max end) − log γ(min end)|, the identity's numerical check
    log_g: float  # log G: Φ(H) b = G q_next


@dataclass
class Shadow:
    """Follows one run of ``spectra.lanczos_steps``: the polynomial certificate per step."""

    n: int
    deltas: tuple[float, ...]
    floor: float
    log_scale: float = 0.0  # Σ over finished cycles of log ‖ψ_c(H) w_c‖
    discarded: list[float] = field(default_factory=list)
    z: np.ndarray | None = None  # the cycle's start vector in its basis (None: e_1)
    t_last: np.ndarray | None = None
    restarts: int = 0
    steps: list[StepBound] = field(default_factory=list)

    def ritz(self, t: np.ndarray) -> None:
        self.t_last = np.array(t, dtype=np.float64)

    def rotate(self, coefficients: np.ndarray) -> None:
        """A thick restart keeps the Ritz vectors Q S_kept (``coefficients``)."""
        t = self.t_last
        assert t is not None
        theta = np.linalg.eigvalsh(t)
        c = np.asarray(coefficients, dtype=np.float64)
        kept_values = np.einsum("ik,ij,jk->k", c, t, c)
        kept_idx = {int(np.argmin(np.abs(theta - v))) for v in kept_values}
        assert len(kept_idx) == len(kept_values), "kept Ritz values not matched"
        discarded = np.delete(theta, sorted(kept_idx))
        z = self._z(t.shape[0])
        projection = c.T @ z
        with np.errstate(divide="ignore"):
            log_psi = np.array([np.sum(np.log(np.abs(v - discarded))) for v in kept_values])
            log_a = log_psi + np.log(np.abs(projection))
        log_norm = 0.5 * float(np.logaddexp.reduce(2 * log_a))
        self.z = (
            np.sign(projection)
            * np.sign(np.prod(np.sign(kept_values[:, None] - discarded), axis=1))
            * np.exp(log_a - log_norm)
        )
        self.log_scale += log_norm
        self.discarded.extend(float(v) for v in discarded)
        self.restarts += 1

    def _z(self, p: int) -> np.ndarray:
        z = np.zeros(p)
        if self.z is None:
            z[0] = 1.0
        else:
            z[: len(self.z)] = self.z
        return z

    def step(self, record: dict) -> None:
        t = self.t_last
        assert t is not None
        p = t.shape[0]
        theta, s = np.linalg.eigh(t)
        w1 = s.T @ self._z(p)
        rho = (float(record["rho_max"]), float(record["rho_min"]))
        ends = ((p - 1, rho[0]), (0, rho[1]))
        log_gamma = []
        with np.errstate(divide="ignore"):
            for i, r in ends:
                others = np.delete(theta, i)
                log_gamma.append(
                    math.log(r)
                    + math.log(abs(w1[i]))
                    + float(np.sum(np.log(np.abs(theta[i] - others))))
                    if r > 0 and w1[i] != 0
                    else -math.inf
                )
            # the less converged end (larger |s_{p,i}|) has ρ_i = β|s_{p,i}| to full relative
            # accuracy; a converged end's tiny ρ is rounding
            which = 0 if abs(s[-1, p - 1]) >= abs(s[-1, 0]) else 1
            i, r = ends[which]
            if self.z is None:  # no restart yet: T tridiagonal, γ = β_1⋯β_{p−1}·β
                beta = r / abs(s[-1, i])
                log_gamma_used = float(np.sum(np.log(np.abs(np.diag(t, 1))))) + (
                    math.log(beta) if beta > 0 else -math.inf
                )
            else:
                log_gamma_used = log_gamma[which]
        finite = [g for g in log_gamma if math.isfinite(g)]
        spread = max(finite) - min(finite) if len(finite) == 2 else 0.0
        log_g = self.log_scale + log_gamma_used
        roots = np.concatenate([theta, np.asarray(self.discarded)])
        hi, lo = float(record["theta_max"]), float(record["theta_min"])
        norm_est = max(abs(hi), abs(lo), 1e-300)
        scale = (max(abs(hi), self.floor * norm_est), max(abs(lo), self.floor * norm_est))
        bound = {}
        for delta in self.deltas:
            target = log_g - 0.5 * log_t0(self.n, delta)
            bound[delta] = (root_beyond(roots, target, True), root_beyond(roots, target, False))
        self.steps.append(StepBound(record["step"], (hi, lo), rho, scale, bound, spread, log_g))


@contextlib.contextmanager
def shadowing(shadow: Shadow) -> Iterator[None]:
    """Record what ``lanczos_steps`` passes to ``_ritz`` and ``_rotate`` (results unchanged)."""
    ritz, rotate = spectra._ritz, spectra._rotate

    def ritz_wrapper(t, *args, **kwargs):
        shadow.ritz(t)
        return ritz(t, *args, **kwargs)

    def rotate_wrapper(basis, rows, coefficients):
        shadow.rotate(coefficients)
        return rotate(basis, rows, coefficients)

    spectra._ritz, spectra._rotate = ritz_wrapper, rotate_wrapper
    try:
        yield
    finally:
        spectra._ritz, spectra._rotate = ritz, rotate


def trace_run(
    run: Callable[[Callable[[dict], None]], spectra.Spectrum], n: int, deltas, floor: float
) -> tuple[Shadow, spectra.Spectrum]:
    shadow = Shadow(n, tuple(deltas), floor)

    def trace(record: dict) -> None:
        if not record.get("check"):
            shadow.step(record)

    with shadowing(shadow):
        spec = run(trace)
    return shadow, spec


def start_quantiles(values: np.ndarray, vectors: np.ndarray, seed: int) -> tuple[float, float]:
    """P(c'² ≤ c²) for the engine's start vector of ``seed`` and each end's eigenspace (c² its
    squared projection there, c'² ~ Beta(1/2, (n−1)/2)): the bound at δ is guaranteed where this
    exceeds δ, and may fail where it does not (the event the certificate excludes)."""
    n = len(values)
    if n <= 1:
        return 1.0, 1.0
    b = spectra._random_unit(n, _gen(seed)).numpy()
    norm = float(np.max(np.abs(values)))
    out = []
    for inside in (values >= values.max() - 1e-12 * norm, values <= values.min() + 1e-12 * norm):
        c2 = float(np.sum((vectors[:, inside].T @ b) ** 2))
        out.append(float(beta_distribution.cdf(c2, 0.5, (n - 1) / 2)))
    return out[0], out[1]


@dataclass
class Firsts:
    """First steps per end (index 0: max, 1: min); None where never met."""

    eig: list[int | None]
    res: list[int | None]
    prob: dict[float, list[int | None]]
    checks: int = 0
    violations: dict[float, int] = field(default_factory=dict)
    worst: dict[float, float] = field(default_factory=dict)  # max true error / (bound + allowance)
    ratio: dict[float, list[float]] = field(default_factory=dict)  # bound / ρ where ρ first passes
    excluded: dict[float, int] = field(default_factory=dict)  # exceeded where quantile ≤ δ
    quantile: tuple[float, float] | None = None


def first_steps(
    shadow: Shadow,
    tol: float,
    truth: tuple[float, float] | None,
    floor: float,
    allowance: float | None,
    quantile: tuple[float, float] | None = None,
) -> Firsts:
    out = Firsts([None, None], [None, None], {d: [None, None] for d in shadow.deltas})
    out.violations = dict.fromkeys(shadow.deltas, 0)
    out.excluded = dict.fromkeys(shadow.deltas, 0)
    out.quantile = quantile
    out.worst = dict.fromkeys(shadow.deltas, 0.0)
    out.ratio = {d: [] for d in shadow.deltas}
    if truth is not None:
        norm = max(abs(truth[0]), abs(truth[1]))
        true_scale = (max(abs(truth[0]), floor * norm), max(abs(truth[1]), floor * norm))
    for sb in shadow.steps:
        for e in range(2):
            if out.res[e] is None and sb.rho[e] <= tol * sb.scale[e]:
                out.res[e] = sb.step
                if sb.rho[e] > 0:
                    for d in shadow.deltas:
                        out.ratio[d].append(sb.bound[d][e] / sb.rho[e])
            for d in shadow.deltas:
                if out.prob[d][e] is None and sb.bound[d][e] <= tol * sb.scale[e]:
                    out.prob[d][e] = sb.step
            if truth is None:
                continue
            err = abs(sb.theta[e] - truth[e])
            if out.eig[e] is None and err <= tol * true_scale[e]:
                out.eig[e] = sb.step
            if allowance is None:
                continue
            for d in shadow.deltas:
                b = sb.bound[d][e]
                out.checks += 1
                if err > b + allowance:
                    if quantile is not None and quantile[e] <= d:
                        out.excluded[d] += 1
                    else:
                        out.violations[d] += 1
                out.worst[d] = max(out.worst[d], err / (b + allowance))
    return out


def _fmt(v: int | None, last: int) -> str:
    return f">{last}" if v is None else str(v)


def print_header(deltas) -> None:
    cols = "".join(f"{'p' + format(d, 'g'):>8}" for d in deltas)
    print(f"{'operator':<34}{'n':>7}{'end':>4}{'eig':>6}{'res':>6}{cols}{'steps':>7}{'prods':>7}")


def print_row(name: str, n: int, f: Firsts, last: int, spec: spectra.Spectrum, deltas) -> None:
    for e, end in enumerate(END_NAMES):
        cols = "".join(f"{_fmt(f.prob[d][e], last):>8}" for d in deltas)
        tail = f"{spec.iterations:>7}{spec.n_products:>7}" if e == 0 else ""
        label = name if e == 0 else ""
        print(
            f"{label:<34}{n if e == 0 else '':>7}{end:>4}{_fmt(f.eig[e], last):>6}"
            f"{_fmt(f.res[e], last):>6}{cols}{tail}"
        )
    hits = [d for d in deltas if f.violations.get(d) or f.excluded.get(d)]
    if hits:
        q = f.quantile
        where = f"start quantiles {q[0]:.2g} / {q[1]:.2g}" if q else "start quantiles unknown"
        counts = ", ".join(f"δ={d:g}: {f.violations[d]} + {f.excluded[d]} excluded" for d in hits)
        print(f"    bound exceeded at step-ends ({where} for max / min): {counts}")


@dataclass
class Totals:
    """Per criterion, Σ over operators of the step at which both ends meet it."""

    deltas: tuple[float, ...]
    eig: int = 0
    res: int = 0
    prob: dict[float, int] = field(default_factory=dict)
    missing: dict[str, int] = field(default_factory=dict)
    checks: int = 0
    violations: dict[float, int] = field(default_factory=dict)
    excluded: dict[float, int] = field(default_factory=dict)
    worst: dict[float, float] = field(default_factory=dict)
    ratio: dict[float, list[float]] = field(default_factory=dict)
    operators: int = 0

    def add(self, f: Firsts, last: int) -> None:
        self.operators += 1

        def both(pair: list[int | None], key: str) -> int:
            if any(v is None for v in pair):
                self.missing[key] = self.missing.get(key, 0) + 1
                return last
            return max(v for v in pair if v is not None)

        if f.eig != [None, None] or f.checks:
            self.eig += both(f.eig, "eig")
        self.res += both(f.res, "res")
        for d in self.deltas:
            self.prob[d] = self.prob.get(d, 0) + both(f.prob[d], f"p{d:g}")
            self.violations[d] = self.violations.get(d, 0) + f.violations.get(d, 0)
            self.excluded[d] = self.excluded.get(d, 0) + f.excluded.get(d, 0)
            self.worst[d] = max(self.worst.get(d, 0.0), f.worst.get(d, 0.0))
            self.ratio.setdefault(d, []).extend(f.ratio.get(d, []))
        self.checks += f.checks

    def report(self, label: str) -> None:
        parts = [f"eig {self.eig}", f"res {self.res}"]
        parts += [f"p{d:g} {self.prob[d]}" for d in self.deltas]
        print(
            f"{label}: {self.operators} operators, steps where both ends meet it (Σ): "
            + ", ".join(parts)
        )
        if self.missing:
            print(f"  not met by the run's last step (counted as it): {self.missing}")
        r = ", ".join(
            f"δ={d:g}: median {np.median(self.ratio[d]):.3g}, min {min(self.ratio[d]):.3g}"
            for d in self.deltas
            if self.ratio.get(d)
        )
        print(f"  probabilistic bound / recurrence residual at the step ρ first passes: {r}")
        if self.checks:
            v = ", ".join(
                f"δ={d:g}: {self.violations[d]} + {self.excluded[d]} where the start's "
                f"quantile ≤ δ (worst true error / (bound + allowance) {self.worst[d]:.2g})"
                for d in self.deltas
            )
            print(f"  bound checked at {self.checks // len(self.deltas)} step-ends; violations {v}")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def dense_operator(
    name: str,
    matrix: torch.Tensor,
    exact: np.ndarray,
    vectors: np.ndarray,
    args,
    totals: Totals,
    *,
    seed: int,
    basis: int | None = None,
    dtype: torch.dtype = torch.float64,
) -> None:
    n = matrix.shape[0]

    def run(trace):
        return spectra.drive(
            spectra.lanczos_steps(
                n,
                generator=_gen(seed),
                tol=args.tol * args.run_tol_factor,
                floor=args.floor,
                max_iter=args.max_iter,
                basis=basis,
                dtype=dtype,
                trace=trace,
            ),
            lambda v: matrix @ v.to(matrix.dtype),
        )

    shadow, spec = trace_run(run, n, args.deltas, args.floor)
    norm = max(abs(exact[0]), abs(exact[-1]))
    allowance = (1e-11 if dtype == torch.float64 else 30 * torch.finfo(dtype).eps) * norm
    quantile = start_quantiles(exact, vectors, seed)
    f = first_steps(shadow, args.tol, (exact[-1], exact[0]), args.floor, allowance, quantile)
    print_row(name, n, f, spec.iterations, spec, args.deltas)
    totals.add(f, spec.iterations)


def engine_blocks(label, eng, blocks, exact, args, totals, seeds, allowance_eps) -> None:
    for name, members in blocks.items():
        ev, vectors = exact[name]
        norm = max(abs(ev[0]), abs(ev[-1]))
        for seed in seeds:

            def run(trace, members=members, seed=seed):
                return spectra.block_spectrum(
                    eng,
                    members,
                    generator=_gen(seed),
                    tol=args.tol * args.run_tol_factor,
                    floor=args.floor,
                    max_iter=args.max_iter,
                    trace=trace,
                )

            n = eng.layout(tuple(members)).numel
            shadow, spec = trace_run(run, n, args.deltas, args.floor)
            quantile = start_quantiles(ev, vectors, seed)
            f = first_steps(
                shadow, args.tol, (ev[-1], ev[0]), args.floor, allowance_eps * norm, quantile
            )
            print_row(f"{label} {name} s{seed}", n, f, spec.iterations, spec, args.deltas)
            totals.add(f, spec.iterations)


def oracles(args) -> None:
    from bench_lockstep import _load, write_examples

    from curvplan_worker.curvature.dense import dense_hessian
    from curvplan_worker.curvature.operator import CurvatureEngine

    sys.path.insert(0, str(ROOT / "tests" / "curvature"))
    from _engine_cases import CASES, build_case
    from test_error_bound import _spectra

    seeds = range(args.seeds)
    print_header(args.deltas)
    tiny = Totals(tuple(args.deltas))
    for case_name in CASES:
        case = build_case(case_name)
        exact = {name: np.linalg.eigh(case.sub(m, m).numpy()) for name, m in case.blocks.items()}
        with CurvatureEngine(case.model, case.objective, case.batches) as eng:
            engine_blocks(case_name, eng, case.blocks, exact, args, tiny, seeds, 1e-11)
    tiny.report("tiny engine-test models, float64")

    hard = Totals(tuple(args.deltas))
    for kind, values in _spectra().items():
        n = len(values)
        q, _ = torch.linalg.qr(torch.randn(n, n, generator=_gen(1), dtype=torch.float64))
        matrix = q @ torch.diag(torch.from_numpy(values)) @ q.T
        for basis in (None, 12):
            for seed in seeds:
                label = f"{kind} basis {basis or 'default'} s{seed}"
                dense_operator(label, matrix, values, q.numpy(), args, hard, seed=seed, basis=basis)
    hard.report("hard spectra of test_error_bound, float64 (default and 12-vector basis)")

    model = write_examples(Path(args.dir))["example"]
    source, module, data, blocks = _load(model, torch.float64)
    exact = {}
    with CurvatureEngine(module, source.objective, data.batches(None)) as eng:
        for name, members in blocks.items():
            h = dense_hessian(eng, members, members).double()
            exact[name] = np.linalg.eigh((0.5 * (h + h.T)).numpy())
    for dtype in args.dtypes:
        totals = Totals(tuple(args.deltas))
        source, module, data, blocks = _load(model, dtype)
        eps = 1e-11 if dtype == torch.float64 else 30 * torch.finfo(dtype).eps
        with CurvatureEngine(module, source.objective, data.batches(None)) as eng:
            engine_blocks(f"example {str(dtype)[6:]}", eng, blocks, exact, args, totals, seeds, eps)
        totals.report(f"bundled example, {str(dtype)[6:]} products")


def gpt2(args) -> None:
    from bench_hf_curvature import head_to_head_blocks, problem

    from curvplan_worker.curvature.objective import CausalLMObjective
    from curvplan_worker.curvature.operator import CurvatureEngine

    model, x, y = problem(args.train_steps)
    blocks = dict(list(head_to_head_blocks(model.module).items())[: args.max_blocks])
    print(
        f"# HF GPT-2 of bench_hf_curvature.py, {len(blocks)} blocks, float32, start seed 0; truth: "
        f"block_spectrum at tol {args.reference_tol:g} (seed 1); run to tol "
        f"{args.tol * args.run_tol_factor:g}"
    )
    print_header(args.deltas)
    totals = Totals(tuple(args.deltas))
    with CurvatureEngine(model.module, CausalLMObjective(), [(x, y)]) as eng:
        for name, members in blocks.items():
            ref = spectra.block_spectrum(eng, members, generator=_gen(1), tol=args.reference_tol)
            norm = max(abs(ref.lambda_max), abs(ref.lambda_min))
            cpu = time.process_time()

            def run(trace, members=members):
                return spectra.block_spectrum(
                    eng,
                    members,
                    generator=_gen(0),
                    tol=args.tol * args.run_tol_factor,
                    floor=args.floor,
                    max_iter=args.max_iter,
                    trace=trace,
                )

            n = eng.layout(tuple(members)).numel
            shadow, spec = trace_run(run, n, args.deltas, args.floor)
            # the reference is itself certified to its residual: allow it (and float32 noise)
            allowance = max(ref.residual_max, ref.residual_min) + 30 * 1.2e-7 * norm
            f = first_steps(
                shadow, args.tol, (ref.lambda_max, ref.lambda_min), args.floor, allowance
            )
            print_row(name, n, f, spec.iterations, spec, args.deltas)
            spread = max(sb.gamma_spread for sb in shadow.steps)
            print(
                f"    {time.process_time() - cpu:.1f} CPU s, {spec.restarts} restarts, basis "
                f"{spec.basis_vectors}; max |log γ(max) − log γ(min)| {spread:.2e}"
            )
            totals.add(f, spec.iterations)
    totals.report("HF GPT-2 blocks (bound checked against the reference)")


def identity(args) -> None:
    """G against ‖Φ(H) b‖ computed directly (Φ over every root, one factor at a time, float64)
    on the hard spectra, default and 12-vector (restarted) basis, while ‖Φ(H) b‖ is above the
    rounding floor of that direct product."""
    sys.path.insert(0, str(ROOT / "tests" / "curvature"))
    from test_error_bound import _spectra

    worst = 0.0
    compared = 0
    for kind, values in _spectra().items():
        n = len(values)
        q, _ = torch.linalg.qr(torch.randn(n, n, generator=_gen(1), dtype=torch.float64))
        matrix = q @ torch.diag(torch.from_numpy(values)) @ q.T
        h = matrix.numpy()
        for basis in (None, 12):
            start = spectra._random_unit(n, _gen(0)).numpy()
            shadow = Shadow(n, (1e-3,), args.floor)
            direct: list[float] = []
            floors: list[float] = []

            def trace(
                record: dict,
                shadow=shadow,
                direct=direct,
                floors=floors,
                start=start,
                h=h,
                values=values,
            ) -> None:
                if record.get("check"):
                    return
                shadow.step(record)
                assert shadow.t_last is not None
                roots = np.concatenate(
                    [np.linalg.eigvalsh(shadow.t_last), np.asarray(shadow.discarded)]
                )
                v, log_norm = start.copy(), 0.0
                # the direct product's rounding: eps · Π ‖H − r‖ (compared only well above it)
                spread = np.maximum(np.abs(values[-1] - roots), np.abs(values[0] - roots))
                floors.append(math.log(1e-16) + float(np.sum(np.log(spread))))
                for r in roots:
                    v = h @ v - r * v
                    size = float(np.linalg.norm(v))
                    log_norm += math.log(size)
                    v /= size
                direct.append(log_norm)

            with shadowing(shadow):
                spectra.drive(
                    spectra.lanczos_steps(
                        n, generator=_gen(0), tol=1e-10, basis=basis, max_iter=60, trace=trace
                    ),
                    lambda v, matrix=matrix: matrix @ v,
                )
            for sb, d, f in zip(shadow.steps, direct, floors, strict=True):
                if d > f + 4 * math.log(10):  # 1e4 above the rounding
                    compared += 1
                    worst = max(worst, abs(sb.log_g - d))
            print(
                f"{kind:<16} basis {basis or 'default':<8} {len(shadow.steps)} steps, "
                f"{shadow.restarts} restarts"
            )
    print(f"identity: |log G − log ‖Φ(H) b‖| at most {worst:.2e} over {compared} steps")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", choices=("identity", "oracles", "gpt2", "all"), default="all")
    ap.add_argument("--tol", type=float, default=1e-3)
    ap.add_argument("--run-tol-factor", type=float, default=0.1)
    ap.add_argument("--floor", type=float, default=1e-3)
    ap.add_argument("--deltas", default="1e-2,1e-3,1e-6")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--max-iter", type=int, default=500)
    ap.add_argument("--dtypes", default="float32,float64")
    ap.add_argument("--dir", default="/tmp/curvplan-bench-examples")
    ap.add_argument("--reference-tol", type=float, default=2e-6)
    ap.add_argument("--max-blocks", type=int, default=6)
    ap.add_argument("--train-steps", type=int, default=100)
    args = ap.parse_args()
    args.deltas = [float(d) for d in args.deltas.split(",")]
    args.dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    torch.set_num_threads(1)
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    print(f"# tol {args.tol:g}, floor {args.floor:g}, δ {args.deltas}")
    if args.part in ("identity", "all"):
        identity(args)
    if args.part in ("oracles", "all"):
        oracles(args)
    if args.part in ("gpt2", "all"):
        gpt2(args)


if __name__ == "__main__":
    main()
