"""Tiny fp64 Transformers (LayerNorm/RMSNorm, attention, GELU and ReLU) and an INDEPENDENT
dense-Hessian oracle: one plain forward over the whole sample (no batching, no engine code),
H rows by differentiating each gradient entry (double backward)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from curvplan_worker.curvature.blocks import default_blocks
from curvplan_worker.curvature.model import build_model
from curvplan_worker.curvature.objective import objective_for

TINY_CLASSIFIER_SPEC = {
    "d_model": 4,
    "n_heads": 2,
    "d_ff": 6,
    "n_layers": 1,
    "norm_position": "post",
    "activation": "gelu",
    "task": {"type": "classification", "seq_len": 3, "input_dim": 2, "n_classes": 3},
}
"""The one-layer classifier the engine-entry tests analyse end to end (seconds, not minutes)."""

CASES = {
    "lm_post_gelu_tied": dict(
        d_model=4,
        n_heads=2,
        d_ff=6,
        n_layers=2,
        norm_position="post",
        activation="gelu",
        task=dict(type="causal_lm", vocab_size=5, seq_len=4, tie_embeddings=True),
    ),
    "cls_pre_relu_rms": dict(
        d_model=4,
        n_heads=2,
        d_ff=6,
        n_layers=1,
        norm="rmsnorm",
        norm_position="pre",
        activation="relu",
        positional="sinusoidal",
        task=dict(type="classification", seq_len=4, vocab_size=6, n_classes=3),
    ),
    "regression_theory": dict(
        d_model=4,
        n_heads=1,
        d_ff=6,
        n_layers=1,
        norm_position="post",
        ln_eps=0.0,
        norm_affine=False,
        activation="relu",
        bias=False,
        attn_output_proj=False,
        positional="none",
        task=dict(type="regression", seq_len=3),
    ),
}


@dataclass
class Case:
    name: str
    model: torch.nn.Module
    objective: object
    inputs: torch.Tensor
    targets: torch.Tensor
    batches: list
    blocks: dict
    names: list
    hessian: torch.Tensor  # independent oracle, full sample in one forward

    def offsets(self) -> dict:
        out, start = {}, 0
        for n, p in self.model.named_parameters():
            out[n] = (start, start + p.numel())
            start += p.numel()
        return out

    def index(self, members: list[str]) -> torch.Tensor:
        off = self.offsets()
        return torch.cat([torch.arange(*off[m]) for m in members])

    def sub(self, rows: list[str], cols: list[str]) -> torch.Tensor:
        return self.hessian[self.index(rows)][:, self.index(cols)]


def make_data(spec: dict, n: int, gen: torch.Generator):
    task = spec["task"]
    seq = task["seq_len"]
    if task["type"] == "causal_lm":
        x = torch.randint(0, task["vocab_size"], (n, seq), generator=gen)
        y = torch.randint(0, task["vocab_size"], (n, seq), generator=gen)
        y[0, :2] = -100  # ignored targets make the per-example counts uneven
        y[3, 1] = -100
        return x, y
    if task["type"] == "classification":
        x = torch.randint(0, task["vocab_size"], (n, seq), generator=gen)
        return x, torch.randint(0, task["n_classes"], (n,), generator=gen)
    d = spec["d_model"]
    x = torch.randn(n, seq, d, generator=gen, dtype=torch.float64)
    return x, torch.randn(n, seq, d, generator=gen, dtype=torch.float64)


def oracle_hessian(model, objective, x, y) -> torch.Tensor:
    params = [p for _, p in model.named_parameters()]
    losses, counts = objective.example_losses(model, x, y)
    loss = losses.sum() / counts.sum()
    grads = torch.autograd.grad(loss, params, create_graph=True)
    flat = torch.cat([g.reshape(-1) for g in grads])
    eye = torch.eye(flat.numel(), dtype=flat.dtype)
    rows = torch.autograd.grad(flat, params, grad_outputs=eye, is_grads_batched=True)
    return torch.cat([r.reshape(flat.numel(), -1) for r in rows], dim=1).detach()


def build_case(name: str, seed: int = 0) -> Case:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _build_case(name, seed)
    finally:
        torch.set_num_threads(threads)


def _build_case(name: str, seed: int) -> Case:
    spec = CASES[name]
    gen = torch.Generator().manual_seed(seed)
    model = build_model(spec, seed=seed, dtype=torch.float64)
    with torch.no_grad():  # move away from the init so every block has real curvature
        for p in model.parameters():
            p.add_(0.4 * torch.randn(p.shape, generator=gen, dtype=torch.float64))
    x, y = make_data(spec, 7, gen)
    objective = objective_for(spec)
    batches = [(x[:3], y[:3]), (x[3:], y[3:])]  # uneven batches
    hessian = oracle_hessian(model, objective, x, y)
    names = [n for n, _ in model.named_parameters()]
    return Case(name, model, objective, x, y, batches, default_blocks(model), names, hessian)
