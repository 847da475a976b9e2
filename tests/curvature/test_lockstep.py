"""Lockstep block spectra and the bounded (thick-restart) Lanczos basis, against the sequential
path and independent oracles: analytic spectra, the dense Hessian (fp64)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from torch import nn

from curvplan_worker.curvature.hvp import CurvatureEngine
from curvplan_worker.curvature.lockstep import Lockstep, Task
from curvplan_worker.curvature.memory import plan_lockstep
from curvplan_worker.curvature.memory_fit import fit_to_memory
from curvplan_worker.curvature.objective import RegressionObjective
from curvplan_worker.curvature.spectra import (
    Spectrum,
    basis_vectors,
    block_spectrum,
    block_steps,
    lanczos_spectrum,
    off_diagonal_norm,
    pair_steps,
)

pytestmark = pytest.mark.usefixtures("single_thread")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# -- the bounded basis -----------------------------------------------------------------------


def test_basis_size_is_the_budget_rule():
    gib = 1024**3
    # GPT-2 small's embed block (38.6 M parameters) in float32 under 2 GiB
    assert basis_vectors(38_600_000, 2 * gib, 4) == 2 * gib // (38_600_000 * 4) == 13
    assert basis_vectors(1_000_000, 2 * gib, 4) == 32  # capped at 32
    assert basis_vectors(38_600_000, 2 * gib, 8) == 6  # float64 (strict) halves it, floor 6
    assert basis_vectors(10, 2 * gib, 4) == 11  # a small operator: the whole Krylov space


def test_a_certified_end_is_not_multiplied_again_while_the_other_converges():
    """λ_max (isolated) certifies early; λ_min sits in a cluster and takes many checks. The
    check products are counted by their Rayleigh quotient: the top's certificate is made once
    (twice at most, should its Ritz value move), not at every later pass."""
    n = 400
    values = np.concatenate([np.linspace(0.0, 1e-2, n - 1), [1.0]])  # a cluster at the bottom
    matrix = torch.diag(torch.from_numpy(values))
    quotients: list[float] = []

    def matvec(v):
        quotients.append(float(v @ matrix @ v / (v @ v)))
        return matrix @ v

    tol = 1e-6
    spec = lanczos_spectrum(matvec, n, generator=_gen(3), tol=tol, basis=8, max_iter=4000)
    assert spec.converged
    assert spec.lambda_max == pytest.approx(1.0, rel=tol)
    assert abs(spec.lambda_min) <= 2 * tol * 1e-3  # the floor: tol · 10⁻³ · ‖H‖
    top_checks = sum(abs(q - 1.0) <= 1e-6 for q in quotients)
    bottom_checks = spec.n_products - spec.iterations - top_checks
    assert 1 <= top_checks <= 2 < bottom_checks


def test_rounding_noise_on_one_end_stops_early_although_the_other_end_is_certified():
    """Products with float32-like noise (2·10⁻⁶ ‖H‖) cannot certify λ_min ≈ 0 to 10⁻⁶ ‖H‖
    (tol 1e-3 × floor 1e-3): the run stops as ``precision_limited`` once the failing end's
    residual stalls at the noise, long before ``max_iter``, also when λ_max's certificate,
    made once, is far above the noise."""
    n = 200
    q, _ = torch.linalg.qr(torch.randn(n, n, generator=_gen(4), dtype=torch.float64))
    matrix = q @ torch.diag(torch.linspace(0.0, 1.0, n, dtype=torch.float64)) @ q.T
    noise = torch.Generator().manual_seed(5)

    def matvec(v):
        hv = matrix @ v
        e = torch.randn(n, generator=noise, dtype=torch.float64)
        return (hv + 2e-6 * v.norm() * e / e.norm()).float()

    spec = lanczos_spectrum(matvec, n, generator=_gen(6), tol=1e-3, basis=30, max_iter=300)
    assert not spec.converged and spec.precision_limited
    assert spec.iterations < 200
    assert spec.lambda_max == pytest.approx(1.0, rel=1e-3)


def test_top_k_vectors_stay_orthonormal_when_the_top_eigenvalues_are_close():
    """A top-k set with vectors comes from one Rayleigh–Ritz: no end is carried over from an
    earlier check (its vector would overlap the current second Ritz vector)."""
    n = 300
    values = torch.cat([torch.linspace(-1.0, 0.5, n - 3), torch.tensor([0.9, 1.0 - 3e-5, 1.0])])
    q, _ = torch.linalg.qr(torch.randn(n, n, generator=_gen(7), dtype=torch.float64))
    matrix = q @ torch.diag(values.double()) @ q.T
    spec = lanczos_spectrum(
        lambda v: matrix @ v,
        n,
        generator=_gen(8),
        tol=1e-3,
        top_k=3,
        ends=("max",),
        want_vectors=True,
        basis=12,
        max_iter=3000,
    )
    assert spec.converged
    vectors = torch.stack([e.vector for e in spec.top])
    gram = vectors @ vectors.T
    assert torch.allclose(gram, torch.eye(3, dtype=gram.dtype), atol=1e-6)
    assert [e.value for e in spec.top] == sorted((e.value for e in spec.top), reverse=True)


@pytest.mark.parametrize("kind", ["diagonal", "rotated"])
def test_thick_restart_with_a_tiny_basis_finds_both_ends_of_a_known_spectrum(kind):
    n = 300
    values = np.concatenate([np.linspace(-2.0, 5.0, n - 2), [7.5, -3.1]])  # gaps at both ends
    if kind == "diagonal":
        matrix = torch.diag(torch.from_numpy(values))
    else:
        q, _ = torch.linalg.qr(torch.randn(n, n, generator=_gen(1), dtype=torch.float64))
        matrix = q @ torch.diag(torch.from_numpy(values)) @ q.T
    tol = 1e-9
    spec = lanczos_spectrum(
        lambda v: matrix @ v, n, generator=_gen(2), tol=tol, basis=6, max_iter=3000
    )
    assert spec.converged
    assert spec.basis_vectors == 6 and spec.restarts > 10
    assert spec.lambda_max == pytest.approx(7.5, rel=tol, abs=0)
    assert spec.lambda_min == pytest.approx(-3.1, rel=tol, abs=0)
    assert spec.residual_max <= tol * 7.5 and spec.residual_min <= tol * 3.1


def test_thick_restart_top_k_in_a_small_basis():
    n = 200
    values = np.linspace(0.0, 1.0, n)
    values[-3:] = [2.0, 2.5, 3.0]
    matrix = torch.diag(torch.from_numpy(values))
    spec = lanczos_spectrum(
        lambda v: matrix @ v, n, generator=_gen(3), tol=1e-8, top_k=3, basis=10, max_iter=2000
    )
    assert spec.converged and spec.restarts > 0
    assert [e.value for e in spec.top] == pytest.approx([3.0, 2.5, 2.0], rel=1e-8)


def test_a_basis_too_small_for_the_wanted_vectors_is_refused():
    with pytest.raises(ValueError, match="basis of 4 vectors"):
        lanczos_spectrum(lambda v: v, 100, generator=_gen(0), top_k=3, basis=4)


def test_a_float32_basis_lives_on_the_products_device_and_certifies_fp32_accuracy():
    n = 500
    values = torch.linspace(-1.0, 4.0, n, dtype=torch.float64)
    matrix = torch.diag(values).float()
    seen: list[torch.Tensor] = []

    def matvec(v: torch.Tensor) -> torch.Tensor:
        seen.append(v)
        return matrix @ v

    spec = lanczos_spectrum(
        matvec, n, generator=_gen(4), tol=1e-4, basis=12, dtype=torch.float32, max_iter=2000
    )
    assert {v.dtype for v in seen} == {torch.float32}
    assert spec.converged
    assert spec.lambda_max == pytest.approx(4.0, rel=1e-4)
    assert spec.lambda_min == pytest.approx(-1.0, rel=1e-4)


def test_bounded_basis_on_a_real_model_matches_the_dense_hessian(lm_case):
    case = lm_case
    tol = 1e-8
    restarted = 0
    # the four largest blocks (the small ones fit a 6-vector basis whole)
    largest = sorted(case.blocks.items(), key=lambda kv: -len(case.index(kv[1])))[:4]
    with CurvatureEngine(case.model, case.objective, case.batches) as eng:
        for block, members in largest:
            h = case.sub(members, members)
            n = h.shape[0]
            exact = np.linalg.eigvalsh(h.numpy())
            norm = max(abs(exact[0]), abs(exact[-1]))
            # a budget of 6 float64 vectors: thick restarts on every block larger than 5
            spec = block_spectrum(
                eng, members, generator=_gen(5), tol=tol, max_iter=3000, basis_budget=6 * n * 8
            )
            assert spec.converged, block
            assert spec.basis_vectors == min(6, n + 1), block
            restarted += spec.restarts > 0
            for got, want in ((spec.lambda_max, exact[-1]), (spec.lambda_min, exact[0])):
                assert abs(got - want) <= tol * max(abs(want), 1e-3 * norm) * 1.01, (block, got)
    assert restarted >= 3


# -- batched products ----------------------------------------------------------------------


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / max(float(b.norm()), 1e-300))


def test_multi_hvp_equals_the_dense_sub_blocks_for_blocks_and_pairs(lm_case):
    case = lm_case
    gen = _gen(6)
    names = list(case.blocks)
    requests = [(case.blocks[n], case.blocks[n]) for n in names]
    requests += [(case.blocks["layers.0.q"], case.blocks["layers.1.v"])]
    requests += [(case.blocks["embed"], case.blocks.get("head", []))]
    requests = [(r, c) for r, c in requests if r and c]
    with CurvatureEngine(case.model, case.objective, case.batches) as eng:
        vectors = [
            torch.randn(len(case.index(c)), generator=gen, dtype=torch.float64) for _, c in requests
        ]
        before = eng.n_hvp
        got = eng.multi_hvp([(r, c, v) for (r, c), v in zip(requests, vectors, strict=True)])
        assert eng.n_hvp - before == len(requests)
        for (rows, cols), v, g in zip(requests, vectors, got, strict=True):
            assert _rel(g, case.sub(rows, cols) @ v) <= 1e-10
            assert _rel(g, eng.hvp(rows, cols, v)) <= 1e-12


# -- lockstep against the sequential path ---------------------------------------------------


def _lockstep(eng, blocks, pairs, *, tol, **kwargs):
    tasks = [
        Task(f"block:{name}", block_steps(eng, m, generator=_gen(100 + i), tol=tol, top_k=1))
        for i, (name, m) in enumerate(blocks.items())
    ]
    tasks += [
        Task(
            f"pair:{r}|{c}",
            pair_steps(eng, blocks[r], blocks[c], generator=_gen(200 + i), tol=tol),
            basis_bytes=1,
        )
        for i, (r, c) in enumerate(pairs)
    ]
    runner = Lockstep(eng, **kwargs)
    return runner.run(tasks), runner


def _sequential(eng, blocks, pairs, *, tol):
    out: dict[str, object] = {}
    for i, (name, m) in enumerate(blocks.items()):
        out[f"block:{name}"] = block_spectrum(eng, m, generator=_gen(100 + i), tol=tol, top_k=1)
    for i, (r, c) in enumerate(pairs):
        out[f"pair:{r}|{c}"] = off_diagonal_norm(
            eng, blocks[r], blocks[c], generator=_gen(200 + i), tol=tol
        )
    return out


PAIRS = [("layers.0.q", "layers.0.k"), ("layers.1.ffn_in", "layers.1.v")]


def _assert_same(lock: dict, seq: dict, rel: float) -> None:
    assert lock.keys() == seq.keys()
    for key, a in lock.items():
        b = seq[key]
        if isinstance(a, Spectrum):
            assert a.converged and b.converged, key
            assert a.lambda_max == pytest.approx(b.lambda_max, rel=rel), key
            assert a.lambda_min == pytest.approx(b.lambda_min, rel=rel), key
        else:
            assert a.converged and b.converged, key
            assert a.sigma_max == pytest.approx(b.sigma_max, rel=rel), key


def test_lockstep_equals_the_sequential_path_and_the_dense_oracle_in_fp64(lm_case):
    case = lm_case
    tol = 1e-10
    with CurvatureEngine(case.model, case.objective, case.batches) as eng:
        lock, runner = _lockstep(eng, case.blocks, PAIRS, tol=tol)
        seq = _sequential(eng, case.blocks, PAIRS, tol=tol)
    _assert_same(lock, seq, 1e-10)
    stats = runner.stats
    assert stats.mode == "batched" and stats.fallback_reason is None
    assert stats.max_running == len(case.blocks) + len(PAIRS)
    assert stats.backwards < stats.products / 4  # batched: far fewer second backwards
    for name, members in case.blocks.items():
        exact = np.linalg.eigvalsh(case.sub(members, members).numpy())
        spec = lock[f"block:{name}"]
        norm = max(abs(exact[0]), abs(exact[-1]))
        assert abs(spec.lambda_max - exact[-1]) <= 1e-9 * max(abs(exact[-1]), 1e-3 * norm)
        assert abs(spec.lambda_min - exact[0]) <= 1e-9 * max(abs(exact[0]), 1e-3 * norm)
    for r, c in PAIRS:
        want = np.linalg.norm(case.sub(case.blocks[r], case.blocks[c]).numpy(), 2)
        assert lock[f"pair:{r}|{c}"].sigma_max == pytest.approx(want, rel=1e-9)


def test_lockstep_in_chunks_and_with_a_basis_room_gives_the_same_numbers(lm_case):
    case = lm_case
    tol = 1e-10
    with CurvatureEngine(case.model, case.objective, case.batches) as eng:
        free, _ = _lockstep(eng, case.blocks, PAIRS, tol=tol)
        # 3 vectors per backward; bases of ~2 blocks at a time (the pairs count 1 byte)
        sizes = [eng.layout(m).numel for m in case.blocks.values()]
        room = 2 * max(sizes) * 8 * 40
        tasks = [
            Task(
                f"block:{name}",
                block_steps(eng, m, generator=_gen(100 + i), tol=tol, top_k=1),
                basis_bytes=max(sizes) * 8 * 40,
            )
            for i, (name, m) in enumerate(case.blocks.items())
        ]
        runner = Lockstep(eng, vectors_per_product=3, basis_room=room)
        bounded = runner.run(tasks)
    assert runner.stats.max_running == 2
    _assert_same(bounded, {k: v for k, v in free.items() if k in bounded}, 1e-10)


# -- the fallback when an operation has no batching rule ------------------------------------


class _Cube(torch.autograd.Function):
    """x³ whose first derivative 3x²·g is itself a custom function (:class:`_Scale`)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x**3

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return _Scale.apply(x, grad)


class _Scale(torch.autograd.Function):
    """3x²·g with a backward that reads a value out of the tensor (``.item()``): fine for one
    vector, impossible under vmap, so a batched second backward raises."""

    @staticmethod
    def forward(ctx, x, grad):
        ctx.save_for_backward(x, grad)
        return 3 * x**2 * grad

    @staticmethod
    def backward(ctx, out):
        x, grad = ctx.saved_tensors
        scale = float(out.abs().max().item()) or 1.0  # data-dependent: no batching rule
        return (6 * x * grad * out / scale) * scale, 3 * x**2 * out


class _CubeNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(3, 4, dtype=torch.float64)
        self.b = nn.Linear(4, 2, dtype=torch.float64)

    def forward(self, x):
        return self.b(_Cube.apply(self.a(x)))


def _dense(model, objective, x, y) -> torch.Tensor:
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for _, p in model.named_parameters()]
    flat = torch.cat([p.detach().reshape(-1) for _, p in model.named_parameters()])

    def loss(w):
        parts, start = {}, 0
        for n, s in zip(names, shapes, strict=True):
            size = int(np.prod(s))
            parts[n] = w[start : start + size].reshape(s)
            start += size
        out = torch.func.functional_call(model, parts, (x,))
        losses, counts = objective.output_losses(out, y)
        return losses.sum() / counts.sum()

    return torch.autograd.functional.hessian(loss, flat)


def test_an_operation_without_a_batching_rule_falls_back_to_a_loop_and_says_why(caplog):
    torch.manual_seed(0)
    model = _CubeNet()
    gen = _gen(9)
    x = torch.randn(6, 3, generator=gen, dtype=torch.float64)
    y = torch.randn(6, 2, generator=gen, dtype=torch.float64)
    objective = RegressionObjective()
    blocks = {"a": ["a.weight", "a.bias"], "b": ["b.weight", "b.bias"]}
    hessian = _dense(model, objective, x, y)
    offsets = {"a": slice(0, 16), "b": slice(16, 26)}
    with CurvatureEngine(model, objective, [(x[:3], y[:3]), (x[3:], y[3:])]) as eng:
        with caplog.at_level(logging.WARNING, logger="curvplan.engine.lockstep"):
            lock, runner = _lockstep(eng, blocks, [("a", "b")], tol=1e-10)
        seq = _sequential(eng, blocks, [("a", "b")], tol=1e-10)
    assert runner.stats.mode == "loop"
    assert runner.stats.fallback_reason and "RuntimeError" in runner.stats.fallback_reason
    assert any("falling back" in r.getMessage() for r in caplog.records)
    _assert_same(lock, seq, 1e-12)
    for name, sl in offsets.items():
        exact = np.linalg.eigvalsh(hessian[sl, sl].numpy())
        assert lock[f"block:{name}"].lambda_max == pytest.approx(exact[-1], rel=1e-9)
        assert lock[f"block:{name}"].lambda_min == pytest.approx(exact[0], rel=1e-9, abs=1e-12)
    want = np.linalg.norm(hessian[offsets["a"], offsets["b"]].numpy(), 2)
    assert lock["pair:a|b"].sigma_max == pytest.approx(want, rel=1e-9)


# -- the memory plan ---------------------------------------------------------------------------


def test_the_lockstep_plan_counts_graph_bases_and_vectors_within_the_budget(lm_case):
    case = lm_case
    with CurvatureEngine(case.model, case.objective, case.batches) as eng:
        plan = fit_to_memory(eng, None, "test", True)
    bases = [4000, 3000, 2000, 1000]
    free = plan_lockstep(plan, bases, 500, 8, None)
    assert free.concurrent == 4 and free.basis_room_bytes is None and free.fits
    assert free.predicted_peak_bytes == pytest.approx(
        free.graph_bytes + sum(bases) + free.vectors_per_product * free.vector_bytes
    )
    budget = int(free.graph_bytes + 7000 + 2 * free.vector_bytes) + 1
    tight = plan_lockstep(plan, bases, 500, 8, budget)
    assert tight.concurrent == 2 and tight.basis_room_bytes == 7000  # the two largest bases
    assert tight.predicted_peak_bytes <= budget and tight.fits
    tiny = plan_lockstep(plan, bases, 500, 8, int(free.graph_bytes) + 10)
    assert not tiny.fits and tiny.concurrent == 1 and tiny.vectors_per_product == 1


# -- analyze end to end ------------------------------------------------------------------------


def test_analyze_runs_its_blocks_and_pairs_in_lockstep_and_matches_the_dense_oracle():
    from _engine_cases import TINY_CLASSIFIER_SPEC, oracle_hessian

    from curvplan.types.options import MachineSettings
    from curvplan_worker.curvature.analyze import analyze
    from curvplan_worker.curvature.data import Dataset
    from curvplan_worker.curvature.model import build_model
    from curvplan_worker.curvature.objective import objective_for

    model = build_model(TINY_CLASSIFIER_SPEC, seed=3, dtype=torch.float64)
    gen = _gen(3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.4 * torch.randn(p.shape, generator=gen, dtype=torch.float64))
    x = torch.randn(8, 3, 2, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 3, (8,), generator=gen)
    options = {
        "precision": "float64",
        "tolerance": 1e-9,
        "blocks": ["layers.0.q", "layers.0.ffn_in", "head"],
        "off_diagonal": [["layers.0.q", "head"]],
        "trace_probes": 0,
        "dense": "off",
        "per_sample": False,
        "gradient_noise": False,
        "bounds": False,
    }
    result = analyze(
        TINY_CLASSIFIER_SPEC,
        None,
        None,
        options,
        machine=MachineSettings(threads=1, self_test=False),
        model=model,
        data=Dataset(x, y),
    )
    lockstep = result["memory_plan"]["lockstep"]
    assert lockstep["mode"] == "batched" and lockstep["max_running"] == 4
    assert lockstep["backwards"] < lockstep["products"]
    assert lockstep["plan"]["concurrent"] == 4 and lockstep["plan"]["fits"]
    assert set(result["memory_plan"]["stages"]) == {"per_sample", "gradient_noise"}
    # the cost model timed the spectra as they ran: each item alone, then the batched round
    # of the 4 vectors in flight (docs/operations.md#cost-model-and-eta)
    timing = result["cost_inputs"]["spectra"]
    assert set(timing["item_ms"]) == {*options["blocks"], "layers.0.q|head"}
    assert timing["batched"] and timing["round_vectors"] == 4
    assert timing["round_ms"] > 0 and timing["one_vector_ms"] > 0
    hessian = oracle_hessian(model, objective_for(TINY_CLASSIFIER_SPEC), x, y)
    offsets, start = {}, 0
    for name, p in model.named_parameters():
        offsets[name] = torch.arange(start, start + p.numel())
        start += p.numel()

    def index(members):
        return torch.cat([offsets[m] for m in members])

    for record in result["blocks"]:
        i = index(record["params"])
        exact = np.linalg.eigvalsh(hessian[i][:, i].numpy())
        assert record["converged"] and record["basis_vectors"] >= 6
        assert record["lambda_max"] == pytest.approx(exact[-1], rel=1e-8)
        norm = max(abs(exact[0]), abs(exact[-1]))
        assert record["lambda_min"] == pytest.approx(exact[0], rel=1e-8, abs=1e-9 * norm)
    params = {r["name"]: r["params"] for r in result["blocks"]}
    (pair,) = result["off_diagonal"]
    rows, cols = index(params[pair["row"]]), index(params[pair["col"]])
    want = np.linalg.norm(hessian[rows][:, cols].numpy(), 2)
    assert pair["converged"] and pair["sigma_max"] == pytest.approx(want, rel=1e-8)


def test_the_plan_batches_small_vectors_on_a_cpu_and_always_on_cuda(lm_case):
    from curvplan_worker.curvature.memory import CPU_BATCHED_VECTOR_BYTES

    with CurvatureEngine(lm_case.model, lm_case.objective, lm_case.batches) as eng:
        plan = fit_to_memory(eng, None, "test", True)
    small = plan_lockstep(plan, [1, 1, 1], 100, 8, None)
    assert small.batched and small.vectors_per_product == 3
    # a union so large that one vector's gathered rows alone exceed the CPU threshold
    n_big = CPU_BATCHED_VECTOR_BYTES // 8
    big = plan_lockstep(plan, [1, 1, 1], n_big, 8, None)
    assert (
        not big.batched
        and big.vectors_per_product == 1
        and "one product per block" in (big.batched_reason)
    )
    assert plan_lockstep(plan, [1, 1, 1], n_big, 8, None, device_type="cuda").batched


def test_time_spectra_times_each_item_and_the_rounds_as_planned_without_counting_them():
    """``limits.time_spectra`` (the cost model's input): a product per block (rows = cols) and
    both directions of a pair in each of three passes, and the batched backward of the first
    min(vectors per product, concurrent, items) vectors, then of one; none counts as the
    analysis's products."""
    from curvplan_worker.curvature.limits import time_spectra

    class Engine:
        device = torch.device("cpu")
        dtype = torch.float32

        def __init__(self):
            self.n_hvp, self.calls, self.batches = 7, [], []
            self.reducer = None

        def layout(self, names):
            return type("L", (), {"numel": 3 * len(names)})()

        def hvp(self, rows, cols, v):
            self.calls.append((tuple(rows), tuple(cols), v.numel()))
            self.n_hvp += 1
            return v

        def multi_hvp(self, requests):
            self.batches.append(len(requests))
            self.n_hvp += len(requests)
            return [v for _, _, v in requests]

    items = [("a", ["a"], ["a"]), ("b", ["b1", "b2"], ["b1", "b2"]), ("a|b", ["a"], ["b1", "b2"])]
    eng = Engine()
    out = time_spectra(eng, items, batched=False, vectors_per_product=1, concurrent=None)
    assert set(out["item_ms"]) == {"a", "b", "a|b"} and not out["batched"]
    one_pass = [
        (("a",), ("a",), 3),
        (("b1", "b2"), ("b1", "b2"), 6),
        (("a",), ("b1", "b2"), 6),
        (("b1", "b2"), ("a",), 3),
    ]
    assert eng.calls == one_pass * 3  # three passes over every item, the median of each
    assert eng.batches == [] and eng.n_hvp == 7
    # the iteration's own cost, per product: a pair makes two products a Lanczos step
    steps = out["step_ms"]
    assert set(steps) == {"a", "b", "a|b"} and min(steps.values()) > 0
    assert steps["a|b"] == pytest.approx(steps["b"] / 2)  # the same operator size, 6
    eng = Engine()
    out = time_spectra(eng, items, batched=True, vectors_per_product=2, concurrent=None)
    assert out["round_vectors"] == 2 and out["batched"]
    assert eng.batches == [2] * 4 + [1] * 4  # one warm-up, then the median of three
    assert eng.n_hvp == 7
    eng = Engine()
    out = time_spectra(
        eng, items, batched=True, vectors_per_product=32, concurrent=1, step_overhead=False
    )
    assert eng.batches == [1] * 4  # one item in flight: the round is the one-vector product
    assert "step_ms" not in out
    # data parallel: every rank votes after each pass, so all stop after the same one
    eng = Engine()
    votes: list[float] = []

    def reducer(t):  # two ranks with the same vote: the sum is twice it
        votes.append(float(t[0]))
        return 2 * t

    eng.reducer = reducer
    time_spectra(eng, items, batched=False, vectors_per_product=1, concurrent=None)
    assert votes == [0.0, 0.0, 0.0]
