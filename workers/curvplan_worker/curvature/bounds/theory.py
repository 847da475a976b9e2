"""The paper's single-head post-LN Transformer block as plain functional torch code.

Petrov et al. 2025, §3.2 (eq. "transformer"), paper orientation (X: L x d_V, W_Q, W_K: d_V x d_K,
W_V: d_V x d_V, W_1: d_V x d_ff, W_2: d_ff x d_V; no biases, no W_O, ReLU, LN without affine):

    A = softmax_row(X W_Q W_K^T X^T / sqrt(d_K)),  F = A X W_V,
    Y = LN(X + F),  S = Y + ReLU(Y W_1) W_2,  Z = LN(S),  l = ||Z - Target||_F^2 / (L d_V).

Used to evaluate exact first-order ingredients of the bounds (dense Jacobians) and, in the tests,
as the reference model whose exact Hessian the bounds must dominate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

SA_KEYS = ("K", "Q", "V")
BLOCK_KEYS = ("1", "2", "K", "Q", "V")


@dataclass(frozen=True)
class TheoryWeights:
    """Weights of the paper's block in the paper's orientation (x @ W)."""

    W_Q: Tensor
    W_K: Tensor
    W_V: Tensor
    W_1: Tensor | None = None
    W_2: Tensor | None = None

    def by_key(self) -> dict[str, Tensor]:
        """Weights keyed by the paper's group names 1, 2, K, Q, V (those present)."""
        out = {"K": self.W_K, "Q": self.W_Q, "V": self.W_V}
        if self.W_1 is not None:
            out["1"] = self.W_1
        if self.W_2 is not None:
            out["2"] = self.W_2
        return out

    def validate(self, X: Tensor) -> None:
        """Raise ValueError naming the tensor whose shape does not fit X (L x d_V)."""
        if X.dim() != 2:
            raise ValueError(f"X: expected (L, d_V), got shape {tuple(X.shape)}")
        d = X.shape[1]
        d_k = self.W_Q.shape[1] if self.W_Q.dim() == 2 else -1
        expected = {"W_Q": (d, d_k), "W_K": (d, d_k), "W_V": (d, d)}
        if self.W_1 is not None:
            d_ff = self.W_1.shape[1] if self.W_1.dim() == 2 else -1
            expected["W_1"] = (d, d_ff)
            expected["W_2"] = (d_ff, d)
            if self.W_2 is None:
                raise ValueError("W_2: required together with W_1")
        for name, shape in expected.items():
            got = tuple(getattr(self, name).shape)
            if got != shape:
                raise ValueError(
                    f"{name}: expected shape {shape} for X of shape {tuple(X.shape)}, got {got}"
                )


def layer_norm(x: Tensor, eps: float = 0.0) -> Tensor:
    """Row-wise LayerNorm without affine, biased variance, eps added to the variance."""
    centred = x - x.mean(dim=-1, keepdim=True)
    var = (centred * centred).mean(dim=-1, keepdim=True)
    return centred / torch.sqrt(var + eps)


def attention(X: Tensor, W_Q: Tensor, W_K: Tensor, W_V: Tensor) -> tuple[Tensor, Tensor]:
    """(A, F): single-head self-attention of Petrov et al. 2025 §3.2 (no mask, no W_O)."""
    scores = X @ W_Q @ W_K.transpose(-1, -2) @ X.transpose(-1, -2) / math.sqrt(W_Q.shape[-1])
    A = torch.softmax(scores, dim=-1)
    return A, A @ X @ W_V


def ffn_residual(Y: Tensor, W_1: Tensor, W_2: Tensor) -> Tensor:
    """S = Y + ReLU(Y W_1) W_2 (no biases)."""
    return Y + torch.relu(Y @ W_1) @ W_2


def block_forward(X: Tensor, w: TheoryWeights, eps: float = 0.0) -> dict[str, Tensor]:
    """All intermediates of the block: A, F, S0 = X + F, Y, P = Y W_1 (pre-activation), R, S, Z."""
    if w.W_1 is None or w.W_2 is None:
        raise ValueError("W_1/W_2: the Transformer block needs the FFN weights")
    A, F = attention(X, w.W_Q, w.W_K, w.W_V)
    S0 = X + F
    Y = layer_norm(S0, eps)
    P = Y @ w.W_1
    R = torch.relu(P)
    S = Y + R @ w.W_2
    Z = layer_norm(S, eps)
    return {"A": A, "F": F, "S0": S0, "Y": Y, "P": P, "R": R, "S": S, "Z": Z}


def mse(output: Tensor, target: Tensor) -> Tensor:
    """The theory's loss ||output - target||_F^2 / (L d_V) (Petrov et al. 2025 §2)."""
    return ((output - target) ** 2).sum() / output.numel()
