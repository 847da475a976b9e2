"""Theorems 4-6 of Petrov et al. 2025: blockwise bounds on the loss Hessian of one post-LN block.

Groups (paper order): 1 = W_1 (ffn_in), 2 = W_2 (ffn_out), K, Q, V. With S = Y + ReLU(Y W_1) W_2,
Z = LN(S), B_i = dS/dW_i and xi_ij = dB_i/dW_j (Theorem 5):

    ||H_tr^(i,j)|| <= ||J_Z|| ||xi_ij|| + ||B_i|| ||H_Z|| ||B_j||              (Theorem 6)
    ||d^2 l / dW_i dW_j|| <= ||d^2l/dZ^2|| ||J_Z B_i|| ||J_Z B_j||
                             + ||dl/dZ|| min(||H_tr^(i,j)||, ||H_tr^(j,i)||)     (S3 general loss)
    ||H|| <= 5 max_(i,j) (the above) =: M_tr                                    (sqrt(5 * 5) = 5)

The ingredient bounds follow the App. B.6 table with the docs/formulas.md#bounds corrections.
Labels follow
the *definition* xi_ij = dB_i/dW_j (the paper prints xi_12 and xi_21 swapped,
docs/formulas.md#bounds):
xi_11 = xi_22 = 0 (ReLU a.e.); ||xi_21|| = ||dB_2/dW_1|| <= sqrt(d_V) ||Y|| (the paper's
"xi_12"); ||xi_12|| = ||dB_1/dW_2|| <= min(sqrt(d_ff) ||Y||_F, sqrt(L) ||Y||) (derived here: the
paper's sqrt(d_ff) ||W_2|| is not a bound on either mixed derivative);
||xi_1k|| <= sqrt(d_ff) ||W_2|| ||J_Y G_k||; ||xi_2k|| <= sqrt(d_V) ||W_1|| ||J_Y G_k||;
||xi_k1|| <= sqrt(L) ||W_2|| ||J_Y G_k|| and ||xi_k2|| <= sqrt(L) ||W_1|| ||J_Y G_k|| (derived);
||xi_kl|| <= ||J_SY|| (||G_k|| ||H_Y|| ||G_l|| + ||J_Y|| ||Phi_kl||).
"""

from __future__ import annotations

import math
from dataclasses import asdict

import torch
from torch import Tensor

from curvplan_worker.curvature.bounds.attention import (
    attention_jacobian_bounds,
    attention_scalars,
    attention_second_bounds,
    spectral_norm,
)
from curvplan_worker.curvature.bounds.layernorm import layernorm_norms
from curvplan_worker.curvature.bounds.options import BoundOptions
from curvplan_worker.curvature.bounds.theory import (
    BLOCK_KEYS,
    SA_KEYS,
    TheoryWeights,
    block_forward,
    ffn_residual,
)


def _dense_block_jacobians(X: Tensor, w: TheoryWeights, eps: float) -> dict[str, float]:
    """Exact norms of the first-order ingredients from dense Jacobians (one sample).

    ||G_k|| = ||dF/dW_k||, ||J_Y G_k|| = ||dY/dW_k||, ||B_i|| = ||dS/dW_i||,
    ||J_Z B_i|| = ||dZ/dW_i||, ||J_SY|| = ||dS/dY||.
    """
    keys = BLOCK_KEYS
    weights = w.by_key()

    def outputs(*ws: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        by_key = dict(zip(keys, ws, strict=True))
        acts = block_forward(
            X,
            TheoryWeights(by_key["Q"], by_key["K"], by_key["V"], by_key["1"], by_key["2"]),
            eps,
        )
        return acts["F"], acts["Y"], acts["S"], acts["Z"]

    jacs = torch.func.jacrev(outputs, argnums=tuple(range(len(keys))))(*(weights[k] for k in keys))
    out = X.numel()
    norms: dict[str, float] = {}
    for name, per_output in zip(("G", "JYG", "B", "JZB"), jacs, strict=True):
        for key, jac in zip(keys, per_output, strict=True):
            if name in ("G", "JYG") and key not in SA_KEYS:
                continue
            norms[f"{name}_{key}"] = spectral_norm(jac.reshape(out, -1))
    Y = block_forward(X, w, eps)["Y"]
    jsy = torch.func.jacrev(lambda y: ffn_residual(y, w.W_1, w.W_2))(Y)
    norms["J_SY"] = spectral_norm(jsy.reshape(out, out))
    return norms


def _dense_second_order(
    X: Tensor, w: TheoryWeights, eps: float
) -> tuple[dict[tuple[str, str], float], dict[tuple[str, str], float]]:
    """Exact ||Phi_kl|| = ||d^2F/dW_k dW_l|| and ||xi_ij|| = ||d^2S/dW_i dW_j|| (matricized
    (out * n_i) x n_j, docs/formulas.md#bounds) by forward-over-reverse (jacfwd(jacrev)). The
    torch 2.13 fault of that route (docs/numerics.md#double-backward) concerns LayerNorm *weights*;
    this
    block has none and writes LN out in elementary ops; the tests compare it with double
    backward."""
    keys = BLOCK_KEYS
    weights = w.by_key()
    sizes = [weights[k].numel() for k in keys]
    flat = torch.cat([weights[k].reshape(-1) for k in keys])

    def f(v: Tensor) -> Tensor:
        parts = dict(zip(keys, torch.split(v, sizes), strict=True))
        p = {k: parts[k].view(weights[k].shape) for k in keys}
        acts = block_forward(X, TheoryWeights(p["Q"], p["K"], p["V"], p["1"], p["2"]), eps)
        return torch.stack([acts["F"], acts["S"]]).reshape(-1)

    hess = torch.func.jacfwd(torch.func.jacrev(f))(flat).view(
        2, X.numel(), flat.numel(), flat.numel()
    )
    offsets, start = {}, 0
    for k, n in zip(keys, sizes, strict=True):
        offsets[k] = slice(start, start + n)
        start += n

    def norm(out: int, i: str, j: str) -> float:
        block = hess[out][:, offsets[i], offsets[j]]
        return spectral_norm(block.reshape(-1, block.shape[-1]))

    phi = {(i, j): norm(0, i, j) for i in SA_KEYS for j in SA_KEYS}
    xi = {(i, j): norm(1, i, j) for i in keys for j in keys}
    return phi, xi


def _xi_bounds(
    ing: dict[str, float], phi: dict[tuple[str, str], float], L: int, d: int, d_ff: int
) -> dict[tuple[str, str], float]:
    """Bounds on ||xi_ij|| = ||dB_i/dW_j|| for all ordered pairs (module docstring)."""
    y, y_f, w1, w2 = ing["Y"], ing["Y_frob"], ing["W_1"], ing["W_2"]
    xi = {
        ("1", "1"): 0.0,
        ("2", "2"): 0.0,
        ("2", "1"): math.sqrt(d) * y,
        ("1", "2"): min(math.sqrt(d_ff) * y_f, math.sqrt(L) * y),
    }
    for k in SA_KEYS:
        jyg = ing[f"JYG_{k}"]
        xi[("1", k)] = math.sqrt(d_ff) * w2 * jyg
        xi[("2", k)] = math.sqrt(d) * w1 * jyg
        xi[(k, "1")] = math.sqrt(L) * w2 * jyg
        xi[(k, "2")] = math.sqrt(L) * w1 * jyg
        for m in SA_KEYS:
            xi[(k, m)] = ing["J_SY"] * (
                ing[f"G_{k}"] * ing["H_Y"] * ing[f"G_{m}"] + ing["J_Y"] * phi[(k, m)]
            )
    return xi


def theorem6_bounds(
    X: Tensor,
    weights: TheoryWeights,
    target: Tensor | None,
    eps: float = 0.0,
    options: BoundOptions | None = None,
    loss_gradient_norm: float | None = None,
    loss_hessian_norm: float | None = None,
) -> dict:
    """Petrov et al. 2025, Theorems 5-6 (+ S3 general-loss form): per-sample block bounds.

    Evaluates, for one sample X (L x d_V), every ingredient of the App. B.6 table, the 25
    ordered bounds ||H_tr^(i,j)||, the 15 unique loss-Hessian block bounds, M_tr = 5 max and
    M_SA = 3 max over the attention sub-blocks (a bound on the (K, Q, V) x (K, Q, V) part).
    The loss defaults to the theory's MSE l = ||Z - Target||_F^2 / (L d_V)
    (||d^2l/dZ^2|| = 2/(L d_V), ||dl/dZ|| = 2 ||Z - Target||_F / (L d_V)); pass
    ``loss_gradient_norm`` / ``loss_hessian_norm`` for another loss of Z. With ``target=None``
    and no loss norms only the loss-free parts (ingredients, xi, ||H_tr||) are returned and
    ``blocks``, ``M_tr``, ``M_SA`` are None.
    ``mode='paper'`` uses the inequality chain (||Y|| <= ||Y||_F = sqrt(L d_V) by Prop. 10,
    ||J_SY|| <= ||W_1|| ||W_2|| + 1, ||B_k|| <= ||J_SY|| ||J_Y|| ||G_k|| ...); ``exact`` uses
    dense-Jacobian values of the first-order ingredients, and of xi_ij and Phi_kl, where the
    dense tensors have at most ``options.max_dense_entries`` entries (the Theorem 5-6
    structure H_tr <= ||J_Z|| ||xi|| + ||B_i|| ||H_Z|| ||B_j|| is kept).
    """
    options = options or BoundOptions()
    weights.validate(X)
    if weights.W_1 is None or weights.W_2 is None:
        raise ValueError("W_1/W_2: Theorem 6 needs the FFN weights")
    if target is not None and target.shape != X.shape:
        raise ValueError(
            f"target: expected the shape of X {tuple(X.shape)}, got {tuple(target.shape)}"
        )
    L, d = X.shape
    d_ff = weights.W_1.shape[1]
    acts = block_forward(X, weights, eps)
    corrections = [
        "xi_labels_by_definition",
        "phi_without_loss_prefactor",
        "s3_loss_gradient_norm",
        "min_over_block_orderings",
        *options.corrections(),
    ]
    s = attention_scalars(X, weights.W_Q, weights.W_K, weights.W_V, options)
    g = attention_jacobian_bounds(s)
    phi = attention_second_bounds(s)
    j_y, h_y = layernorm_norms(acts["S0"], eps, None, options.ln_norms, options.sigma_min)
    j_z, h_z = layernorm_norms(acts["S"], eps, None, options.ln_norms, options.sigma_min)
    w1, w2 = spectral_norm(weights.W_1), spectral_norm(weights.W_2)
    ing: dict[str, float] = {
        "X": s.x,
        "W_Q": s.q,
        "W_K": s.k,
        "W_V": s.v,
        "W_1": w1,
        "W_2": w2,
        "J_Y": j_y,
        "H_Y": h_y,
        "J_Z": j_z,
        "H_Z": h_z,
        "Y": math.sqrt(L * d),
        "Y_frob": math.sqrt(L * d),
        "J_SY": w1 * w2 + 1.0,
        "sigma_YW1": spectral_norm(acts["R"]),
    }
    for k in SA_KEYS:
        ing[f"G_{k}"] = g[k]
        ing[f"JYG_{k}"] = j_y * g[k]
    dense_ok = False
    if options.mode == "exact":
        n_total = sum(t.numel() for t in weights.by_key().values())
        dense_ok = 4 * X.numel() * n_total <= options.max_dense_entries
        ing["Y"] = spectral_norm(acts["Y"])
        ing["Y_frob"] = float(acts["Y"].norm())
        if dense_ok:
            ing.update(_dense_block_jacobians(X, weights, eps))
            corrections.append("exact_first_order_ingredients")
        else:
            corrections.append("exact_ingredients_skipped_size")
    if not dense_ok:
        ing["B_1"] = w2 * ing["Y"]
        ing["B_2"] = ing["sigma_YW1"]
        for k in SA_KEYS:
            ing[f"B_{k}"] = ing["J_SY"] * j_y * g[k]
        for key in BLOCK_KEYS:
            ing[f"JZB_{key}"] = j_z * ing[f"B_{key}"]
    xi = _xi_bounds(ing, phi, L, d, d_ff)
    n_total = sum(t.numel() for t in weights.by_key().values())
    if options.mode == "exact" and 2 * X.numel() * n_total**2 <= options.max_dense_entries:
        phi, xi = _dense_second_order(X, weights, eps)
        corrections.append("exact_second_order_ingredients")
    h_tr = {
        (i, j): ing["J_Z"] * xi[(i, j)] + ing[f"B_{i}"] * ing["H_Z"] * ing[f"B_{j}"]
        for i in BLOCK_KEYS
        for j in BLOCK_KEYS
    }
    result = {
        "M_tr": None,
        "M_tr_formula": "5 * max_(i,j) block bound (Theorem 6, S3 general-loss form)",
        "M_tr_block_matrix": None,
        "M_SA": None,
        "M_SA_formula": "3 * max over the (K, Q, V) blocks of the block loss Hessian bounds",
        "blocks": None,
        "H_tr": {i + j: v for (i, j), v in h_tr.items()},
        "xi": {i + j: v for (i, j), v in xi.items()},
        "Phi": {i + j: v for (i, j), v in phi.items()},
        "ingredients": ing,
        "attention_scalars": asdict(s),
        "corrections": corrections,
    }
    if target is None and (loss_hessian_norm is None or loss_gradient_norm is None):
        return result
    if loss_hessian_norm is None:
        loss_hessian_norm = 2.0 / (L * d)
    if loss_gradient_norm is None:
        loss_gradient_norm = 2.0 * float((acts["Z"] - target).norm()) / (L * d)
    blocks: dict[str, dict[str, float]] = {}
    for a, i in enumerate(BLOCK_KEYS):
        for j in BLOCK_KEYS[a:]:
            outer = loss_hessian_norm * ing[f"JZB_{i}"] * ing[f"JZB_{j}"]
            functional = loss_gradient_norm * min(h_tr[(i, j)], h_tr[(j, i)])
            blocks[i + j] = {"outer": outer, "functional": functional, "value": outer + functional}

    def pair(i: str, j: str) -> float:
        a, b = sorted((i, j), key=BLOCK_KEYS.index)
        return blocks[a + b]["value"]

    grid = torch.tensor([[pair(i, j) for j in BLOCK_KEYS] for i in BLOCK_KEYS], dtype=torch.float64)
    sa_values = [pair(i, j) for i in SA_KEYS for j in SA_KEYS]
    ing["loss_gradient_norm"] = loss_gradient_norm
    ing["loss_hessian_norm"] = loss_hessian_norm
    result.update(
        M_tr=5.0 * float(grid.max()),
        M_tr_block_matrix=spectral_norm(grid),
        M_SA=3.0 * max(sa_values),
        blocks=blocks,
    )
    return result
