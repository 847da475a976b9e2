"""A small, briefly trained causal LM on a synthetic Markov-chain language (``curvplan example``).

The language: a first-order Markov chain over ``vocab_size`` tokens whose transition rows put
most of their mass on a few successors (Dirichlet draws with a small concentration), so a
2-layer Transformer learns it in a few hundred Adam steps on a CPU; its entropy rate is the
best achievable loss and is written into the spec directory for reference.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from curvplan_worker.curvature.checkpoint import save_checkpoint
from curvplan_worker.curvature.data import Dataset, save_dataset
from curvplan_worker.curvature.model import build_model
from curvplan_worker.curvature.objective import dataset_loss, objective_for
from curvplan_worker.sweep.moments import save_moments

EXAMPLE_SPEC = {
    "d_model": 32,
    "n_heads": 2,
    "d_ff": 64,
    "n_layers": 2,
    "norm": "layernorm",
    "norm_position": "pre",
    "activation": "gelu",
    "positional": "learned",
    "task": {"type": "causal_lm", "vocab_size": 16, "seq_len": 32, "tie_embeddings": False},
}


def markov_chain(vocab: int, generator: torch.Generator, concentration: float = 0.1):
    """Transition matrix (rows sum to 1) and its stationary distribution."""
    alpha = torch.full((vocab,), concentration, dtype=torch.float64)
    gamma = torch.distributions.Gamma(alpha, torch.ones_like(alpha))
    torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=generator)))
    rows = gamma.sample((vocab,))
    trans = rows / rows.sum(dim=1, keepdim=True)
    evals, evecs = torch.linalg.eig(trans.T)
    k = int(torch.argmin((evals - 1).abs()))
    pi = evecs[:, k].real
    pi = (pi / pi.sum()).clamp_min(0)
    return trans, pi / pi.sum()


def entropy_rate(trans: torch.Tensor, pi: torch.Tensor) -> float:
    """H = −Σ_i π_i Σ_j P_ij log P_ij (nats per token): the best achievable mean loss."""
    logp = torch.where(trans > 0, trans.log(), torch.zeros_like(trans))
    return float(-(pi[:, None] * trans * logp).sum())


def sample_sequences(
    trans: torch.Tensor, pi: torch.Tensor, n: int, length: int, generator: torch.Generator
) -> torch.Tensor:
    """n sequences of ``length`` + 1 tokens from the chain started in its stationary law."""
    seq = torch.empty(n, length + 1, dtype=torch.int64)
    seq[:, 0] = torch.multinomial(pi, n, replacement=True, generator=generator)
    for t in range(length):
        seq[:, t + 1] = torch.multinomial(trans[seq[:, t]], 1, generator=generator)[:, 0]
    return seq


def write_example(
    out_dir: str | Path,
    *,
    steps: int = 300,
    batch_size: int = 32,
    n_eval: int = 64,
    seed: int = 0,
    lr: float = 3e-3,
    n_train: int = 4096,
    checkpoint_steps: tuple[int, ...] = (10, 25, 50, 100, 200),
) -> dict:
    """Train the example model and write into ``out_dir``: ``spec.json``,
    ``checkpoint.safetensors`` (w* at the end), ``data.safetensors`` (held-out evaluation
    sample), ``train.safetensors`` (the ``n_train`` training sequences the model was trained
    on, for sweeps) and ``step_<n>.safetensors`` intermediate checkpoints at
    ``checkpoint_steps`` (for the gradient-noise trend, and as a sweep's start), each (after
    step 0) with the optimizer's moments beside it, ``step_<n>.optimizer.safetensors``: what a
    branch sweep starts that checkpoint's branches from. Returns a summary."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    spec = EXAMPLE_SPEC
    task = spec["task"]
    gen = torch.Generator().manual_seed(seed)
    trans, pi = markov_chain(task["vocab_size"], gen)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: one thread is fastest and shares the CPU politely
    model = build_model(spec, seed=seed)
    model.train()
    objective = objective_for(spec)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    first = last = math.nan
    train_seq = sample_sequences(trans, pi, n_train, task["seq_len"], gen)
    saved = []
    try:
        for step in range(steps):
            if step in checkpoint_steps:
                save_checkpoint(model, out / f"step_{step}.safetensors", step=step)
                if step > 0:  # the Adam moments beside it: a branch sweep starts from them
                    save_moments(model, opt, out / f"step_{step}.optimizer.safetensors")
                saved.append(step)
            pick = torch.randint(0, n_train, (batch_size,), generator=gen)
            seq = train_seq[pick]
            loss = dataset_loss(objective, model, seq[:, :-1], seq[:, 1:])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            for group in opt.param_groups:  # cosine decay to a near-stationary w*
                group["lr"] = lr * 0.5 * (1 + math.cos(math.pi * (step + 1) / steps))
            last = float(loss.detach())
            first = last if step == 0 else first
    finally:
        torch.set_num_threads(threads)
    model.eval()
    eval_seq = sample_sequences(trans, pi, n_eval, task["seq_len"], gen)
    data = Dataset(eval_seq[:, :-1].contiguous(), eval_seq[:, 1:].contiguous())
    with torch.no_grad():
        eval_loss = float(dataset_loss(objective, model, data.inputs, data.targets))
    (out / "spec.json").write_text(json.dumps(spec, indent=2) + "\n")
    save_checkpoint(model, out / "checkpoint.safetensors")
    save_dataset(data, out / "data.safetensors")
    save_dataset(
        Dataset(train_seq[:, :-1].contiguous(), train_seq[:, 1:].contiguous()),
        out / "train.safetensors",
    )
    summary = {
        "intermediate_checkpoints": [f"step_{n}.safetensors" for n in saved],
        "n_train": n_train,
        "steps": steps,
        "first_train_loss": first,
        "last_train_loss": last,
        "eval_loss": eval_loss,
        "entropy_rate": entropy_rate(trans, pi),
        "uniform_loss": math.log(task["vocab_size"]),
        "n_parameters": sum(p.numel() for p in model.parameters()),
        "seed": seed,
    }
    (out / "example.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
