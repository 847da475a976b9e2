"""Each link of the Theorem 5-6 chain against its exact value (dense autograd, fp64).

For random instances of the paper's block (Petrov et al. 2025 §3.2) the exact matricized
norms (docs/formulas.md#bounds: an (out * n_i) x n_j matrix for a second derivative) of
G_k = dF/dW_k, Phi_kl = d^2F/dW_k dW_l, B_i = dS/dW_i, xi_ij = d^2S/dW_i dW_j,
J_Z B_i = dZ/dW_i, H_tr^(i,j) = d^2Z/dW_i dW_j are computed by jacrev/jacfwd on an
independent implementation and must not exceed the package's bounds (paper and exact mode).
"""

from __future__ import annotations

import math

import pytest
import torch

from curvplan_worker.curvature.bounds import BoundOptions, theorem6_bounds
from curvplan_worker.curvature.bounds.theory import TheoryWeights

torch.set_default_dtype(torch.float64)
KEYS = ("1", "2", "K", "Q", "V")
SA = ("K", "Q", "V")
N_INSTANCES = 60
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _ln(x: torch.Tensor, eps: float) -> torch.Tensor:
    mu = x.mean(dim=-1, keepdim=True)
    return (x - mu) / torch.sqrt(((x - mu) ** 2).mean(dim=-1, keepdim=True) + eps)


def _outputs(X: torch.Tensor, eps: float, W: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    scores = (X @ W["Q"]) @ (X @ W["K"]).T / math.sqrt(W["Q"].shape[1])
    F = torch.softmax(scores, dim=1) @ X @ W["V"]
    Y = _ln(X + F, eps)
    S = Y + torch.relu(Y @ W["1"]) @ W["2"]
    return {"F": F, "S": S, "Z": _ln(S, eps)}


def _instance(seed: int):
    g = torch.Generator().manual_seed(seed)
    L, d = int(torch.randint(1, 4, (1,), generator=g)), int(torch.randint(3, 5, (1,), generator=g))
    d_k, d_ff = (
        int(torch.randint(1, 4, (1,), generator=g)),
        int(torch.randint(1, 6, (1,), generator=g)),
    )
    qk = 0.2 + 2.5 * float(torch.rand(1, generator=g))
    W = {
        "1": torch.randn(d, d_ff, generator=g),
        "2": torch.randn(d_ff, d, generator=g),
        "K": torch.randn(d, d_k, generator=g) * qk,
        "Q": torch.randn(d, d_k, generator=g) * qk,
        "V": torch.randn(d, d, generator=g),
    }
    X = torch.randn(L, d, generator=g) * (0.3 + 2 * float(torch.rand(1, generator=g)))
    eps = (0.0, 1e-5, 1e-2)[seed % 3]
    return X, W, eps, f"seed={seed} L={L} d_V={d} d_K={d_k} d_ff={d_ff} eps={eps}"


def _dense(X, eps, W) -> tuple[dict, dict]:
    """First and second derivatives of (F, S, Z) w.r.t. all weights, flattened in KEYS order:
    ({out: (Ld, n)}, {out: (Ld, n, n)}) from one jacrev and one jacfwd(jacrev)."""
    sizes = [W[k].numel() for k in KEYS]

    def f(flat: torch.Tensor) -> torch.Tensor:
        parts = dict(zip(KEYS, torch.split(flat, sizes), strict=True))
        weights = {k: parts[k].view(W[k].shape) for k in KEYS}
        out = _outputs(X, eps, weights)
        return torch.stack([out["F"], out["S"], out["Z"]]).reshape(3, -1)

    flat = torch.cat([W[k].reshape(-1) for k in KEYS])
    jac = torch.func.jacrev(f)(flat)
    hess = torch.func.jacfwd(torch.func.jacrev(f))(flat)
    names = ("F", "S", "Z")
    return (
        {n: jac[a] for a, n in enumerate(names)},
        {n: hess[a] for a, n in enumerate(names)},
    )


def test_forward_over_reverse_oracle_matches_double_backward() -> None:
    """The jacfwd(jacrev) oracle against reverse-over-reverse (docs/numerics.md#double-backward:
    forward-
    over-reverse was wrong for LayerNorm weights in torch 2.13; here LN has no weights, and
    this check guards the oracle anyway)."""
    X, W, eps, _ = _instance(4)
    _, hess = _dense(X, eps, W)
    sizes = [W[k].numel() for k in KEYS]
    flat = torch.cat([W[k].reshape(-1) for k in KEYS])

    def fsz(v: torch.Tensor) -> torch.Tensor:
        parts = dict(zip(KEYS, torch.split(v, sizes), strict=True))
        out = _outputs(X, eps, {k: parts[k].view(W[k].shape) for k in KEYS})
        return torch.cat([out["F"].reshape(-1), out["S"].reshape(-1), out["Z"].reshape(-1)])

    rr = torch.autograd.functional.jacobian(
        lambda v: torch.autograd.functional.jacobian(fsz, v, create_graph=True, vectorize=True),
        flat,
        vectorize=True,
    )
    ours = torch.cat([hess["F"], hess["S"], hess["Z"]])
    assert float(hess["Z"].norm()) > 1e-3 and float(hess["F"].norm()) > 1e-3
    torch.testing.assert_close(ours, rr, rtol=1e-10, atol=1e-10)


def _slices(W) -> dict[str, slice]:
    out, start = {}, 0
    for k in KEYS:
        out[k] = slice(start, start + W[k].numel())
        start += W[k].numel()
    return out


def _norm(m: torch.Tensor) -> float:
    return float(torch.linalg.matrix_norm(m, ord=2)) if m.numel() else 0.0


@pytest.mark.slow
def test_every_ingredient_bound_dominates_its_exact_value() -> None:
    violations = []
    for seed in range(N_INSTANCES):
        X, W, eps, label = _instance(seed)
        weights = TheoryWeights(W["Q"], W["K"], W["V"], W["1"], W["2"])
        jac, hess = _dense(X, eps, W)
        sl = _slices(W)

        def first(out: str, i: str, jac=jac, sl=sl) -> float:
            return _norm(jac[out][:, sl[i]])

        def second(out: str, i: str, j: str, hess=hess, sl=sl, X=X) -> float:
            block = hess[out][:, sl[i], sl[j]]  # (Ld, n_i, n_j) -> (Ld * n_i) x n_j
            return _norm(block.reshape(X.numel() * block.shape[1], block.shape[2]))

        for mode in ("paper", "exact"):
            res = theorem6_bounds(X, weights, None, eps, BoundOptions(mode=mode))
            ing = res["ingredients"]

            def check(name: str, bound: float, exact: float, tag=f"{label} mode={mode}") -> None:
                if bound < exact * (1 - 1e-9) - 1e-12:
                    violations.append(f"{tag}: {name} bound {bound:.6g} < exact {exact:.6g}")

            for k in SA:
                check(f"G_{k}", ing[f"G_{k}"], first("F", k))
                for m in SA:
                    check(f"Phi_{k}{m}", res["Phi"][k + m], second("F", k, m))
            for i in KEYS:
                check(f"B_{i}", ing[f"B_{i}"], first("S", i))
                check(f"J_Z B_{i}", ing[f"JZB_{i}"], first("Z", i))
                for j in KEYS:
                    check(f"xi_{i}{j}", res["xi"][i + j], second("S", i, j))
                    check(f"H_tr^({i},{j})", res["H_tr"][i + j], second("Z", i, j))
    assert not violations, "\n".join(violations[:20])
