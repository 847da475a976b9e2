"""Self-attention ingredients and Theorem 1 (single self-attention layer, MSE, W_Q, W_K, W_V).

Petrov et al. 2025, Theorem 1 and its proof (App. B.1), with the corrections of
docs/formulas.md#bounds:
||dA/dT|| <= 1/2 in general (the paper's 1/L holds for uniform attention only), ||A|| <= sqrt(L)
(the paper's L is also valid), the Phi blocks taken without the loss prefactor 2/(L d_V) (it
belongs to the loss gradient), the proof's dropped 1/L restored, and the consolidated constant
computed as 3 * max of the per-block component bounds (the statement and proof disagree).

Norm convention: a second derivative d^2 N / dW_i dW_j is the (out * n_i) x n_j matricization
(docs/formulas.md#bounds); its spectral norm is max over unit directions v of W_j of the Frobenius
(Hilbert-Schmidt) norm of the directional derivative of the Jacobian dN/dW_i.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
from torch import Tensor

from curvplan_worker.curvature.bounds.options import BoundOptions
from curvplan_worker.curvature.bounds.theory import SA_KEYS, attention

SOFTMAX_HESSIAN_BOUND = 6.0  # ||d^2 A / dT^2|| <= 6 (Ormaniec et al. 2025 Lemma C.1, via S2)


def spectral_norm(m: Tensor) -> float:
    """Largest singular value of a matrix (not the Frobenius norm; docs/formulas.md)."""
    if m.numel() == 0:
        return 0.0
    return float(torch.linalg.matrix_norm(m, ord=2))


def softmax_jacobian_norm(A: Tensor) -> float:
    """Exact ||dA/dT||_2 for row-softmax A: max over rows of lambda_max(diag(a) - a a^T).

    Each row block is PSD with norm <= max_i 2 a_i (1 - a_i) <= 1/2 (Gershgorin;
    docs/formulas.md#bounds); under uniform attention it is 1/L (Noci et al. 2022 Lemma A.3).
    """
    blocks = torch.diag_embed(A) - A.unsqueeze(-1) * A.unsqueeze(-2)
    return float(torch.linalg.eigvalsh(blocks).max())


@dataclass(frozen=True)
class AttentionScalars:
    """The scalars the attention bounds are built from (one sample)."""

    L: int
    d: int
    d_K: int
    x: float  # ||X||_2
    x_frob: float  # ||X||_F (exact) or its bound sqrt(min(L, d)) ||X||_2 (paper mode)
    q: float  # ||W_Q||_2
    k: float  # ||W_K||_2
    v: float  # ||W_V||_2
    c_A: float  # bound on ||dA/dT||_2
    a_norm: float  # bound on ||A||_2
    c_A2: float = SOFTMAX_HESSIAN_BOUND  # bound on ||d^2A/dT^2|| (matricized)


def attention_scalars(
    X: Tensor, W_Q: Tensor, W_K: Tensor, W_V: Tensor, options: BoundOptions
) -> AttentionScalars:
    """Spectral norms of X and the weights and the softmax constants chosen by ``options``.

    ``mode='exact'`` uses the exact ||dA/dT|| and ||A|| of this sample and ||X||_F; ``paper``
    uses c_A in {1/2, 1/L}, ||A|| <= sqrt(L) or L and ||X||_F <= sqrt(min(L, d)) ||X||_2.
    """
    L, d = X.shape
    x = spectral_norm(X)
    if options.mode == "exact":
        A, _ = attention(X, W_Q, W_K, W_V)
        c_a = softmax_jacobian_norm(A)
        a_norm = spectral_norm(A)
        x_frob = float(X.norm())
    else:
        c_a = 0.5 if options.c_A == "1/2" else 1.0 / L
        a_norm = math.sqrt(L) if options.A_norm == "sqrt_L" else float(L)
        x_frob = math.sqrt(min(L, d)) * x
    return AttentionScalars(
        L=L,
        d=d,
        d_K=W_Q.shape[1],
        x=x,
        x_frob=x_frob,
        q=spectral_norm(W_Q),
        k=spectral_norm(W_K),
        v=spectral_norm(W_V),
        c_A=c_a,
        a_norm=a_norm,
    )


def attention_jacobian_bounds(s: AttentionScalars) -> dict[str, float]:
    """Bounds on ||G_k|| = ||dF/dW_k|| (Petrov et al. 2025, App. B.6 table; Noci et al. A.2).

    G_V = A X (x) I: ||A|| ||X||; G_Q: c_A ||W_V|| ||W_K|| ||X||^3 / sqrt(d_K); G_K likewise
    with ||W_Q|| (the paper's 1/L is c_A = 1/L).
    """
    root = math.sqrt(s.d_K)
    return {
        "V": s.a_norm * s.x,
        "Q": s.c_A * s.v * s.k * s.x**3 / root,
        "K": s.c_A * s.v * s.q * s.x**3 / root,
    }


def attention_second_bounds(s: AttentionScalars) -> dict[tuple[str, str], float]:
    """Bounds on ||Phi_kl|| = ||d G_k / d W_l|| = ||d^2 F / dW_k dW_l|| for ordered (k, l).

    Petrov et al. 2025 Lemma 2 / App. B.6 without the loss prefactor 2/(L d_V)
    (docs/formulas.md#bounds):
    Phi_VV = 0; Phi_VQ <= sqrt(d_V) c_A ||W_K|| x^3 / sqrt(d_K) (the paper's "S" factor);
    Phi_QQ <= 6 ||W_V|| ||W_K||^2 x^5 / d_K; Phi_QK <= 6 ||W_V|| ||W_K|| ||W_Q|| x^5 / d_K +
    c_A ||W_V|| x^2 ||X||_F / sqrt(d_K) (the paper's sqrt(d_V) x^3 with ||X||_F <= sqrt(d_V) x).
    The orderings the paper leaves to "symmetry" are derived here by the same chain:
    Phi_QV <= c_A ||W_K|| x min(||X||_F^2, sqrt(L) x^2) / sqrt(d_K) (Hilbert-Schmidt of
    U -> X U W_K^T X^T is ||X||_F ||X W_K||_F; or sqrt(L) from U -> U X W_V), K likewise.
    """
    root = math.sqrt(s.d_K)
    x, xf, q, k, v = s.x, s.x_frob, s.q, s.k, s.v
    hs_xx = min(xf**2, math.sqrt(s.L) * x**2)
    quad = s.c_A2 * v * x**5 / s.d_K
    mixed = s.c_A * v * x**2 * xf / root
    return {
        ("V", "V"): 0.0,
        ("V", "Q"): math.sqrt(s.d) * s.c_A * k * x**3 / root,
        ("V", "K"): math.sqrt(s.d) * s.c_A * q * x**3 / root,
        ("Q", "V"): s.c_A * k * x * hs_xx / root,
        ("K", "V"): s.c_A * q * x * hs_xx / root,
        ("Q", "Q"): quad * k**2,
        ("K", "K"): quad * q**2,
        ("Q", "K"): quad * q * k + mixed,
        ("K", "Q"): quad * q * k + mixed,
    }


def _dense_attention_jacobians(
    X: Tensor, W_Q: Tensor, W_K: Tensor, W_V: Tensor
) -> dict[str, float]:
    """Exact ||G_k|| from dense Jacobians of F w.r.t. each attention weight."""

    def f(wq: Tensor, wk: Tensor, wv: Tensor) -> Tensor:
        return attention(X, wq, wk, wv)[1]

    jq, jk, jv = torch.func.jacrev(f, argnums=(0, 1, 2))(W_Q, W_K, W_V)
    out = X.numel()
    return {
        "Q": spectral_norm(jq.reshape(out, -1)),
        "K": spectral_norm(jk.reshape(out, -1)),
        "V": spectral_norm(jv.reshape(out, -1)),
    }


def dense_attention_second_derivatives(
    X: Tensor, W_Q: Tensor, W_K: Tensor, W_V: Tensor
) -> dict[tuple[str, str], float]:
    """Exact ||Phi_kl|| = ||d^2F/dW_k dW_l|| in the (L d_V n_k) x n_l matricization, by
    forward-over-reverse on the unmasked single-head attention (no LayerNorm involved)."""
    weights = {"K": W_K, "Q": W_Q, "V": W_V}
    sizes = [weights[k].numel() for k in SA_KEYS]
    flat = torch.cat([weights[k].reshape(-1) for k in SA_KEYS])

    def f(v: Tensor) -> Tensor:
        p = dict(zip(SA_KEYS, torch.split(v, sizes), strict=True))
        return attention(X, p["Q"].view(W_Q.shape), p["K"].view(W_K.shape), p["V"].view(W_V.shape))[
            1
        ].reshape(-1)

    hess = torch.func.jacfwd(torch.func.jacrev(f))(flat)
    offsets, start = {}, 0
    for k, n in zip(SA_KEYS, sizes, strict=True):
        offsets[k] = slice(start, start + n)
        start += n
    out = {}
    for i in SA_KEYS:
        for j in SA_KEYS:
            block = hess[:, offsets[i], offsets[j]]
            out[(i, j)] = spectral_norm(block.reshape(-1, block.shape[-1]))
    return out


def theorem1_statement_constant(s: AttentionScalars, target_norm: float) -> float:
    """Theorem 1's consolidated M as printed in the main text (for reference only; unused).

    Petrov et al. 2025 Theorem 1 (docs/formulas.md#bounds): it assumes c_A = 1/L and ||A|| <= L and
    its constants disagree with the proof; reported so the discrepancy is visible.
    """
    L, d, dk = s.L, s.d, s.d_K
    x, q, k, v = s.x, s.q, s.k, s.v
    r = math.sqrt(min(L, d))
    rho = L * x * v + target_norm
    terms = (
        2 * L / d * x**2,
        8 / (L**3 * d * dk) * k**2 * v**2 * x**6 + 12 / (d * dk) * r * rho * v * k**2 * x**5,
        4 / (L * d * math.sqrt(dk)) * v * k * x**4
        + 4 * r / (L**2 * math.sqrt(dk)) * rho * k * x**3,
        8 / (L**3 * d * dk) * k * q * v**2 * x**6
        + 4 * r * rho / (L * d * math.sqrt(dk)) * v * (3 * L * k * q * x**5 + d / L * x**3),
    )
    return 3.0 * max(terms)


def theorem1_bounds(
    X: Tensor,
    W_Q: Tensor,
    W_K: Tensor,
    W_V: Tensor,
    target: Tensor,
    options: BoundOptions | None = None,
) -> dict:
    """Petrov et al. 2025, Theorem 1: ||H_i(w*)|| <= M for one self-attention layer with MSE.

    Loss l = ||F(X) - Target||_F^2 / (L d_V), parameters (W_K, W_Q, W_V). Per block (i, j):
    ||H_ij|| <= H_o + H_f with H_o = (2/(L d_V)) ||G_i|| ||G_j|| (outer product) and
    H_f = ||dl/dF|| ||Phi_ij|| = (2/(L d_V)) rho ||Phi_ij|| (functional), rho bounding
    ||F - Target||_F: the paper's sqrt(min(L, d_V)) (||A|| x ||W_V|| + ||Target||_2) in
    ``paper`` mode, the exact value in ``exact`` mode. Phi is bounded through either ordering
    (H_ij = H_ji^T), the smaller is used. M = 3 max_(i,j) (block-matrix inequality with 3 x 3
    blocks), computed from these components ("theorem1_proof_constants"); the statement's
    formula is reported separately as ``M_statement`` and not used.
    """
    options = options or BoundOptions()
    if X.dim() != 2 or target.shape != X.shape:
        raise ValueError(
            f"target: expected the shape of X {tuple(X.shape)}, got {tuple(target.shape)}"
        )
    s = attention_scalars(X, W_Q, W_K, W_V, options)
    corrections = [
        "theorem1_proof_constants",
        "phi_without_loss_prefactor",
        "min_over_block_orderings",
        *options.corrections(),
    ]
    g_norms = attention_jacobian_bounds(s)
    if options.mode == "exact":
        out_entries = X.numel() * (W_Q.numel() + W_K.numel() + W_V.numel())
        if out_entries <= options.max_dense_entries:
            g_norms = _dense_attention_jacobians(X, W_Q, W_K, W_V)
            corrections.append("exact_first_order_ingredients")
        else:
            corrections.append("exact_ingredients_skipped_size")
        rho = float((attention(X, W_Q, W_K, W_V)[1] - target).norm())
    else:
        rho = math.sqrt(min(s.L, s.d)) * (s.a_norm * s.x * s.v + spectral_norm(target))
    phi = attention_second_bounds(s)
    n_total = W_Q.numel() + W_K.numel() + W_V.numel()
    if options.mode == "exact" and X.numel() * n_total**2 <= options.max_dense_entries:
        phi = dense_attention_second_derivatives(X, W_Q, W_K, W_V)
        corrections.append("exact_second_order_ingredients")
    scale = 2.0 / (s.L * s.d)
    blocks = {}
    for a, i in enumerate(SA_KEYS):
        for j in SA_KEYS[a:]:
            h_o = scale * g_norms[i] * g_norms[j]
            h_f = scale * rho * min(phi[(i, j)], phi[(j, i)])
            blocks[f"{i}{j}"] = {"H_o": h_o, "H_f": h_f, "value": h_o + h_f}
    grid = torch.tensor(
        [
            [blocks["".join(sorted((i, j), key=SA_KEYS.index))]["value"] for j in SA_KEYS]
            for i in SA_KEYS
        ],
        dtype=torch.float64,
    )
    return {
        "M": 3.0 * max(b["value"] for b in blocks.values()),
        "M_formula": "3 * max_(i,j) (H_o(i,j) + H_f(i,j)), components of the Theorem 1 proof",
        "M_block_matrix": spectral_norm(grid),
        "M_statement": theorem1_statement_constant(s, spectral_norm(target)),
        "blocks": blocks,
        "G": g_norms,
        "Phi": {f"{i}{j}": val for (i, j), val in phi.items()},
        "rho": rho,
        "scalars": asdict(s),
        "corrections": corrections,
    }
