"""Does the budget predict training? Every budget number against a brute-force ground truth.

Real text (the English prose of the Perl documentation the system Perl ships, split by
document), a character-level reference Transformer of the engine's spec family, and the
benchmark's own training loops (``benchmarks/predictive/``, independent of the sweep code):

* B_crit from per-batch tuned learning rates at 5–7 batch sizes (steps to the target loss,
  S = S_min(1 + B_crit/B), McCandlish et al. 2018);
* the data needed for each target loss from nested subsets, each trained to convergence with
  a cosine schedule over a horizon that grows with the subset (L(D) monotone within noise);
* λ_max of the full Hessian at the converged checkpoint (Lanczos over all parameters) and
  gradient descent at 0.9× / 1.1× of 2/λ_max.

Then a scratch service (``bench_service.scratch_service``) gets the converged checkpoint,
the intermediate checkpoints, the training examples and the held-out sample; it runs a batch
sweep, a data sweep and two analyses (intermediates only; intermediates + sweeps), and the
budget's numbers are printed beside the truth with their ratio and whether they are within
1.5×. The ground truth is cached per mode and seed in
``benchmarks/results/predictive-truth-<mode>.json`` (keyed by a hash of the settings and of
the corpus, written after every seed), so a rerun measures only the seeds missing
(``--fresh-truth`` measures all again). The seeds run in processes of their own (``--jobs``,
default 2) while the service half runs.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_predictive.py --quick
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_predictive.py
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import multiprocessing
import os
import platform
import resource
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from predictive import branch, compare  # noqa: E402
from predictive.corpus import VOCAB, find_documents, split_by_document  # noqa: E402
from predictive.training import held_out_loss, to_tensors, train  # noqa: E402
from predictive.truth import (  # noqa: E402
    BatchSettings,
    DataSettings,
    batch_truth,
    curvature_truth,
    data_truth,
    fit_s_of_b,
    nearest_power_of_two,
    steps_at,
)

RESULTS = HERE / "results"


def _json_default(value: object) -> object:
    """numpy scalars and arrays as Python numbers and lists; anything else as text."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)


@dataclass(frozen=True)
class Mode:
    """Everything that shapes the numbers (hashed into the truth cache's key)."""

    name: str
    seeds: tuple[int, ...]
    d_model: int
    n_heads: int
    d_ff: int
    n_layers: int
    seq_len: int
    n_eval: int
    ref_steps: int
    ref_lr: float
    ref_batch: int
    target_fraction: float  # target = the reference run's held-out loss at this fraction
    # (neither it nor more_target_fractions is one of intermediate_fractions: a target is not
    # an intermediate checkpoint's loss)
    intermediate_fractions: tuple[float, ...]
    batch_sizes: tuple[int, ...]
    batch_max_steps: int
    batch_lr_start: float
    max_lrs: int
    batch_repeats: int
    data_sizes: tuple[int, ...]
    data_steps: tuple[int, ...]
    data_lrs: tuple[float, ...]
    data_batch: int
    lanczos_iterations: int
    gd_steps: int
    service_eval_every: int
    service_lr_grid: tuple[float, ...]
    analysis_options: dict = field(default_factory=dict, hash=False)
    more_target_fractions: tuple[float, ...] = ()  # the data truth's further targets
    data_epochs: float = 0.0  # > 0: every subset trains data_epochs passes (the epochs rule)
    data_min_steps: int = 0
    data_max_steps: int = 0

    def data_settings(self, targets: tuple[float, ...]) -> DataSettings:
        """The data truth's settings for ``targets`` (the first is the budget's target)."""
        return DataSettings(
            self.data_sizes,
            targets[0],
            self.data_batch,
            self.data_steps,
            self.data_lrs,
            epochs=self.data_epochs,
            min_steps=self.data_min_steps,
            max_steps=self.data_max_steps,
            more_targets=tuple(targets[1:]),
        )

    def spec(self) -> dict:
        return {
            "d_model": self.d_model,
            "n_heads": self.n_heads,
            "d_ff": self.d_ff,
            "n_layers": self.n_layers,
            "norm": "layernorm",
            "norm_position": "pre",
            "activation": "gelu",
            "positional": "learned",
            "task": {
                "type": "causal_lm",
                "vocab_size": len(VOCAB),
                "seq_len": self.seq_len,
                "tie_embeddings": False,
            },
        }

    def key(self) -> str:
        """The hash of the settings the ground truth depends on (the service half's own
        settings, ``service_*`` and ``analysis_options``, are left out: changing how the
        service is asked does not invalidate the truth)."""
        truth_fields = {
            k: v
            for k, v in dataclasses.asdict(self).items()
            if not k.startswith("service_") and k != "analysis_options"
        }
        blob = json.dumps(truth_fields, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


QUICK = Mode(
    name="quick",
    seeds=(0,),
    d_model=32,
    n_heads=2,
    d_ff=64,
    n_layers=2,
    seq_len=32,
    n_eval=256,
    ref_steps=400,
    ref_lr=3e-3,
    ref_batch=32,
    target_fraction=0.3,
    intermediate_fractions=(0.05, 0.1, 0.2, 0.4, 0.6),
    batch_sizes=(8, 16, 32, 64, 128),
    batch_max_steps=1500,
    batch_lr_start=3e-3,
    max_lrs=3,
    batch_repeats=1,
    data_sizes=(250, 500, 1000, 2000, 4000),
    data_steps=(300,) * 5,
    data_lrs=(3e-3,),
    data_batch=32,
    lanczos_iterations=60,
    gd_steps=30,
    service_eval_every=10,
    service_lr_grid=(1.0,),
    analysis_options={"tolerance": 1e-4, "trace_probes": 10, "n_directions": 4},
    more_target_fractions=(0.5,),
    data_epochs=20.0,
    data_min_steps=200,
    data_max_steps=2500,
)
#: The full mode: the quick mode's model and reference run (so the two are comparable and the
#: service half costs about the same), with what the ground truth needs to be trusted: 2 seeds,
#: 6 batch sizes with up to 4 lrs each and 3 data orders per lr, 6 nested subsets with a
#: 3-value lr grid on the ends.
#: Profiled on the quick run (per seed: batch sizes 56 %, data 23 %, λ_max + GD 13 %, reference
#: 8 %; the service half, two analyses most of it, is ~80 % of the total), the d_model-48 model
#: the first draft used would have cost ~4 wall-hours on the shared machine.
FULL = dataclasses.replace(
    QUICK,
    name="full",
    seeds=(0, 1),
    batch_sizes=(8, 16, 32, 64, 128, 256),
    max_lrs=4,
    batch_repeats=3,
    data_sizes=(250, 500, 1000, 2000, 4000, 8000),
    data_steps=(300,) * 6,
    data_lrs=(1.5e-3, 3e-3, 6e-3),
    lanczos_iterations=80,
)
MODES = {"full": FULL, "quick": QUICK}


def cpu_self() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def corpus(mode: Mode):
    docs = find_documents()
    split = split_by_document(docs, mode.seq_len)
    manifest = split.manifest()
    digest = hashlib.sha256(
        json.dumps([[d["path"], d["sha256"]] for side in manifest.values() for d in side]).encode()
    ).hexdigest()
    pick = np.random.default_rng(12345).choice(len(split.val_x), mode.n_eval, replace=False)
    pick.sort()
    return split, manifest, digest, pick


def make_factory(mode: Mode):
    from curvplan_worker.curvature.model import build_model

    spec = mode.spec()
    return lambda seed: build_model(spec, seed=seed)


def reference_run(mode: Mode, make_model, data, seed: int) -> tuple[torch.nn.Module, dict, dict]:
    """The team's own training run: B = ref_batch, cosine over ref_steps; the converged
    checkpoint and the intermediate checkpoints a user would upload."""
    tx, ty, vx, vy = data
    saves = tuple(sorted({max(1, round(f * mode.ref_steps)) for f in mode.intermediate_fractions}))
    states: dict[int, dict] = {}
    model = make_model(seed)
    run = train(
        model,
        tx,
        ty,
        vx,
        vy,
        batch_size=mode.ref_batch,
        lr=mode.ref_lr,
        max_steps=mode.ref_steps,
        seed=seed,
        schedule="cosine",
        eval_every=max(1, mode.ref_steps // 40),
        save_at=saves,
        on_save=lambda step, m: states.__setitem__(
            step, {k: v.detach().clone() for k, v in m.named_parameters()}
        ),
    )
    losses = {}
    for step, state in states.items():
        probe = make_model(seed)
        with torch.no_grad():
            for name, p in probe.named_parameters():
                p.copy_(state[name])
        losses[step] = held_out_loss(probe, vx, vy)
    info = {
        "run": run.as_dict(),
        "final_loss": held_out_loss(model, vx, vy),
        "intermediate_losses": losses,
    }
    return model, states, info


def target_from_reference(info: dict, fraction: float, ref_steps: int) -> float:
    """The held-out loss the reference run had at ``fraction`` of its steps (interpolated),
    rounded up to 0.01: the loss the benchmark asks the budget to reach."""
    steps, losses = info["run"]["eval_steps"], info["run"]["eval_losses"]
    loss = float(np.interp(fraction * ref_steps, steps, losses))
    return math.ceil(loss * 100) / 100


def load_data(mode: Mode):
    """The corpus split, its manifest and hash, the held-out sample and the tensors."""
    split, manifest, corpus_hash, pick = corpus(mode)
    eval_np = (split.val_x[pick], split.val_y[pick])
    tx, ty = to_tensors(split.train_x, split.train_y)
    vx, vy = to_tensors(*eval_np)
    return split, manifest, corpus_hash, eval_np, (tx, ty, vx, vy)


def targets_from_reference(info: dict, mode: Mode) -> tuple[float, ...]:
    """The budget's target (``target_fraction``) and the data truth's further ones
    (``more_target_fractions``), each the reference run's held-out loss there."""
    fractions = (mode.target_fraction, *mode.more_target_fractions)
    return tuple(target_from_reference(info, f, mode.ref_steps) for f in fractions)


def seed_truth(mode: Mode, data, make_model, seed: int, targets: tuple[float, ...] | None) -> dict:
    """One seed's ground truth: its reference run (and the targets from it when none are given
    yet), the tuned steps per batch size, L(D) on nested subsets and the full-Hessian λ_max."""
    t0 = cpu_self()
    print(f"[truth] seed {seed}: reference run", flush=True)
    model, _states, ref = reference_run(mode, make_model, data, seed)
    if targets is None:
        targets = targets_from_reference(ref, mode)
    target = targets[0]
    print(f"[truth] seed {seed}: target loss {target}; batch sizes", flush=True)
    batch = batch_truth(
        make_model,
        data,
        BatchSettings(
            mode.batch_sizes,
            target,
            mode.batch_lr_start,
            mode.batch_max_steps,
            max_lrs=mode.max_lrs,
            repeats=mode.batch_repeats,
        ),
        seed,
    )
    print(f"[truth] seed {seed}: B_crit {batch['fit'].get('b_crit')}; data sizes", flush=True)
    data_fit = data_truth(
        make_model,
        data,
        mode.data_settings(targets),
        seed,
    )
    print(f"[truth] seed {seed}: data {data_fit['needed_for_target']}; λ_max", flush=True)
    curv = curvature_truth(
        model,
        (data[2], data[3]),
        iterations=mode.lanczos_iterations,
        gd_steps=mode.gd_steps,
        seed=seed,
    )
    print(f"[truth] seed {seed}: λ_max {curv['lambda_max']:.5g}", flush=True)
    return {
        "target_loss": target,
        "targets": list(targets),
        "reference": ref,
        "batch": batch,
        "data": data_fit,
        "curvature": curv,
        "cpu_s": cpu_self() - t0,
    }


def _seed_truth_process(mode_name: str, seed: int, target: tuple[float, ...]) -> dict:
    """``seed_truth`` in a worker process of its own (spawned: it rebuilds the corpus, which is
    deterministic); its CPU is the whole process's, imports included."""
    torch.set_num_threads(1)
    mode = MODES[mode_name]
    *_, data = load_data(mode)
    out = seed_truth(mode, data, make_factory(mode), seed, target)
    out["cpu_s"] = cpu_self()
    return out


class TruthCache:
    """``benchmarks/results/predictive-truth-<mode>.json``: the ground truth seed by seed, keyed
    by the settings' hash and the corpus hash, written after every seed, so a rerun (or an
    interrupted run) reuses every seed already measured. Other settings or another corpus:
    nothing is reused."""

    def __init__(self, mode: Mode, corpus_hash: str, *, fresh: bool) -> None:
        self.path = RESULTS / f"predictive-truth-{mode.name}.json"
        self.mode = mode
        self.corpus_hash = corpus_hash
        self.truth: dict = {"seeds": {}}
        if not fresh and self.path.exists():
            stored = json.loads(self.path.read_text())
            if stored.get("mode_key") == mode.key() and stored.get("corpus_hash") == corpus_hash:
                self.truth = stored
                print(f"[truth] reusing {self.path.name} (seeds {list(stored['seeds'])})")
            else:
                print(f"[truth] {self.path.name} is for other settings or another corpus")
        self._lock = threading.Lock()

    def missing(self) -> list[int]:
        return [s for s in self.mode.seeds if str(s) not in self.truth["seeds"]]

    def add(self, seed: int, result: dict) -> None:
        with self._lock:
            self.truth.setdefault("target_loss", result.pop("target_loss"))
            self.truth.setdefault("targets", result.pop("targets", [self.truth["target_loss"]]))
            self.truth["seeds"][str(seed)] = result
            self.truth.update(
                mode_key=self.mode.key(),
                corpus_hash=self.corpus_hash,
                mode=dataclasses.asdict(self.mode),
            )
            RESULTS.mkdir(exist_ok=True)
            tmp = self.path.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(self.truth, indent=1, default=_json_default) + "\n")
            tmp.replace(self.path)


def start_truth(mode: Mode, cache: TruthCache, target: tuple[float, ...], jobs: int):
    """The missing seeds in ``jobs`` spawned processes (one seed each); every result lands in
    the cache as it arrives. The futures are returned so the service half runs meanwhile."""
    missing = cache.missing()
    if not missing:
        return None, []
    context = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(
        max_workers=min(jobs, len(missing)), mp_context=context, max_tasks_per_child=1
    )
    futures = []
    for seed in missing:
        future = pool.submit(_seed_truth_process, mode.name, seed, target)
        future.add_done_callback(
            lambda f, seed=seed: cache.add(seed, f.result()) if f.exception() is None else None
        )
        futures.append(future)
    return pool, futures


def pooled_batch_fit(seeds: dict) -> dict | None:
    """S = S_min(1 + B_crit/B) fitted once to the seeds' pooled table: at each batch size the
    geometric mean of the seeds' tuned steps (a batch size some seed never reached is left
    out). One fit of the pooled steps is steadier than a mean of per-seed fits, each of which
    can be thrown by one noisy batch size."""
    tables = [{p["batch_size"]: p["steps"] for p in s["batch"]["points"]} for s in seeds.values()]
    sizes = sorted(set.intersection(*(set(t) for t in tables)))
    pooled = [
        (b, float(np.exp(np.mean([np.log(t[b]) for t in tables]))))
        for b in sizes
        if all(t[b] is not None and t[b] > 0 for t in tables)
    ]
    if len(pooled) < 3:
        return None
    fit = fit_s_of_b([b for b, _ in pooled], [v for _, v in pooled])
    return {**fit, "steps": dict(pooled)}


def summarise(truth: dict) -> dict:
    """One truth per field: B_crit and S_min from one fit of the seeds' pooled steps
    (:func:`pooled_batch_fit`), the rest geometric means over seeds (the service gets seed 0's
    checkpoint, so λ_max is seed 0's), with the per-seed values in the notes."""
    seeds = truth["seeds"]

    def gmean(values: list[float]) -> float | None:
        values = [v for v in values if v is not None and v > 0]
        return float(np.exp(np.mean(np.log(values)))) if values else None

    b = [s["batch"]["fit"].get("b_crit") for s in seeds.values()]
    s_min = [s["batch"]["fit"].get("s_min") for s in seeds.values()]
    pooled = pooled_batch_fit(seeds) if len(seeds) > 1 else None
    d = [s["data"]["needed_for_target"]["examples"] for s in seeds.values()]
    bounds = [s["data"]["needed_for_target"]["bound"] for s in seeds.values()]
    first = seeds[min(seeds, key=int)]
    fits = [s["batch"]["fit"] for s in seeds.values()]
    if pooled is not None and pooled.get("b_crit") is not None:
        b_crit, s_min_truth = pooled["b_crit"], pooled["s_min"]
        fits = [pooled]
        how = f"pooled fit of {len(seeds)} seeds (rms rel. resid. "
        how += f"{pooled['rms_relative_residual']:.3f}); "
    else:
        b_crit = gmean(b) if all(v is not None for v in b) else None
        s_min_truth = gmean(s_min)
        how = ""

    def steps(batch_size: float) -> float | None:
        values = [steps_at(f, batch_size) for f in fits]
        return gmean(values) if all(v is not None for v in values) else None

    fmt = ", ".join
    by_target = data_by_target(truth)
    return {
        "b_crit": b_crit,
        "b_crit_note": how + "per seed " + fmt("—" if v is None else f"{v:.3g}" for v in b),
        "b_crit_pow2": None if b_crit is None else nearest_power_of_two(b_crit),
        "b_crit_per_seed": b,
        "s_min": s_min_truth,
        "steps_at": steps,
        "data_needed": gmean(d) if all(v is not None for v in d) else None,
        "data_needed_note": "per seed "
        + fmt(f"{v:,.0f}" if v is not None else str(bd) for v, bd in zip(d, bounds, strict=True))
        + by_target[0]["spread_text"],
        "data_by_target": by_target,
        "lambda_max": first["curvature"]["lambda_max"],
        "gd_threshold": first["curvature"]["gd_threshold"],
    }


def data_by_target(truth: dict) -> list[dict]:
    """Per target: the data each seed's L(D) needs, their geometric mean and spread (the
    largest over the smallest seed's: how far the truth itself moves between seeds)."""
    seeds = truth["seeds"]
    targets = truth.get("targets") or [truth["target_loss"]]
    out = []
    for k, target in enumerate(targets):
        values, bounds = [], []
        for s in seeds.values():
            needed = s["data"].get("needed") or [s["data"]["needed_for_target"]]
            entry = needed[k] if k < len(needed) else {"examples": None, "bound": "not measured"}
            values.append(entry["examples"])
            bounds.append(entry["bound"])
        known = [v for v in values if v is not None and v > 0]
        spread = max(known) / min(known) if len(known) > 1 else None
        out.append(
            {
                "target_loss": target,
                "per_seed": values,
                "bounds": bounds,
                "examples": float(np.exp(np.mean(np.log(known))))
                if known and len(known) == len(values)
                else None,
                "spread": spread,
                "spread_text": "" if spread is None else f" (seeds' spread ×{spread:.2f})",
            }
        )
    return out


#: The seed of the sample ``--train-pool`` draws from the training split.
TRAIN_POOL_SEED = 2468


def service_train(split, args) -> tuple[np.ndarray, np.ndarray]:
    """The training examples the service gets: the whole training split, or with
    ``--train-pool N`` a seeded sample of N of them (the truth's subsets are drawn from the
    same split, so the data needed for a target does not depend on the pool; the pool only
    sets the sizes the printed data sweep starts from, and so its cost)."""
    pool = getattr(args, "train_pool", None)
    if not pool or pool >= len(split.train_x):
        return split.train_x, split.train_y
    pick = np.sort(np.random.default_rng(TRAIN_POOL_SEED).permutation(len(split.train_x))[:pool])
    return split.train_x[pick], split.train_y[pick]


def service_workdir(mode: Mode, args) -> Path:
    """Where the uploaded files are written (``--workdir``, else one per mode and pool)."""
    pool = getattr(args, "train_pool", None)
    suffix = f"-pool{pool}" if pool else ""
    return Path(args.workdir or f"/tmp/curvplan-predictive-{mode.name}-{mode.key()}{suffix}")


def service_half(mode: Mode, truth: dict, eval_np, data, split, models, args) -> dict:
    from predictive.service import ask_service, write_files

    seed = min(mode.seeds)
    workdir = service_workdir(mode, args)
    train_x, train_y = service_train(split, args)
    files = branch.existing_files(workdir, mode.spec()) if seed not in models else None
    if files is None:
        model, states = models[seed]
        files = write_files(
            workdir,
            checkpoint_model=model,
            intermediates=states,
            train=(train_x, train_y),
            evaluation=eval_np,
            spec=mode.spec(),
        )
    only_branch = getattr(args, "only", None) == "branch"
    target = truth["target_loss"]
    optimizer = {
        "name": "adamw",
        "lr": mode.ref_lr,
        "base_batch_size": mode.ref_batch,
        "warmup_steps": 10,
        "lr_rule": "grid" if len(mode.service_lr_grid) > 1 else "sqrt",
        "lr_grid": list(mode.service_lr_grid),
    }
    print(f"[service] sweeps and analyses at target loss {target}", flush=True)
    targets = truth.get("targets") or [target]
    answers = ask_service(
        args.admin_url,
        files,
        spec=mode.spec(),
        target_loss=target,
        available_samples=len(train_x),
        batch_sweep=None
        if only_branch
        else {
            "type": "batch",
            "target_loss": target,
            "batch_sizes": list(mode.batch_sizes),
            "max_steps": mode.batch_max_steps,
            "eval_every": mode.service_eval_every,
        },
        # the data sweep is the one the first analysis's budget.data.next_step prints, run as
        # printed, and the next rounds the analyses given it print (service.run_printed)
        follow_data_next_step=not only_branch,
        optimizer=optimizer,
        analysis_options=mode.analysis_options,
        branch_sweep=branch.branch_sweep_settings(
            mode.batch_sizes, mode.seq_len, branch.checkpoint_steps(files["intermediates"])
        ),
        first_analyze=not only_branch,
        more_targets=() if only_branch else tuple(targets[1:]),
        max_next_rounds=args.max_next_rounds,
    )
    answers["only"] = "branch" if only_branch else None
    return answers


def markdown(mode: Mode, truth: dict, summary: dict, rows, service: dict | None, meta: dict) -> str:
    seeds = truth["seeds"]
    lines = [
        f"# Predictive benchmark, mode `{mode.name}` ({meta['date']})",
        "",
        f"Machine: {meta['machine']}. {meta['load_note']}",
        f"CPU: truth {meta['truth_cpu_s'] / 60:.1f} min (this run: "
        f"{meta['truth_cpu_s_this_run'] / 60:.1f} min), service "
        f"{meta['service_cpu_s'] / 60:.1f} min, total {meta['total_cpu_s'] / 60:.1f} CPU-minutes; "
        f"wall {meta['wall_s'] / 60:.1f} min.",
        "",
        f"Corpus: {meta['corpus']['documents']} Perl documentation files "
        f"({meta['corpus']['train_docs']} train / {meta['corpus']['val_docs']} validation, "
        f"split by document), {meta['corpus']['train_examples']:,} training examples of "
        f"{mode.seq_len} characters, held-out sample {mode.n_eval} examples; corpus hash "
        f"`{meta['corpus']['hash'][:16]}` (file list with sha256 in the JSON).",
        f"Model: {meta['n_parameters']:,} parameters ({mode.n_layers} layers, d_model "
        f"{mode.d_model}, vocabulary {len(VOCAB)} characters). Target held-out loss "
        f"{truth['target_loss']} nats/char (the reference run's loss at "
        f"{mode.target_fraction:.0%} of its {mode.ref_steps} steps, between its intermediate "
        f"checkpoints); the data truth's further targets "
        f"{', '.join(map(str, (truth.get('targets') or [])[1:])) or '—'} (at "
        f"{', '.join(f'{f:.0%}' for f in mode.more_target_fractions) or '—'}).",
        "",
        "## Ground truth per seed",
        "",
        "| seed | final loss | B_crit | S_min | fit rms rel. resid. | data for target | "
        "λ_max (full) | 2/λ_max | GD 0.9× monotone | GD 1.1× monotone |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for seed, s in seeds.items():
        fit = s["batch"]["fit"]
        need = s["data"]["needed_for_target"]
        gd = {g["factor"]: g for g in s["curvature"]["gd"]}
        lines.append(
            f"| {seed} | {s['reference']['final_loss']:.4f} | "
            f"{fit.get('b_crit') or float('nan'):.4g} | {fit.get('s_min', float('nan')):.4g} | "
            f"{fit.get('rms_relative_residual', float('nan')):.3f} | "
            f"{(need['examples'] and format(need['examples'], ',.0f')) or need['bound']} | "
            f"{s['curvature']['lambda_max']:.4g} | {s['curvature']['gd_threshold']:.4g} | "
            f"{gd.get(0.9, {}).get('monotone', '—')} | {gd.get(1.1, {}).get('monotone', '—')} |"
        )
    lines += ["", "Steps to the target at each batch size (tuned lr), seed by seed:", ""]
    lines.append("| seed | " + " | ".join(f"B={b}" for b in mode.batch_sizes) + " |")
    lines.append("|---|" + "---:|" * len(mode.batch_sizes))
    for seed, s in seeds.items():
        cells = [
            "censored" if p["steps"] is None else f"{p['steps']:.0f} (lr {p['best_lr']:.2g})"
            for p in s["batch"]["points"]
        ]
        lines.append(f"| {seed} | " + " | ".join(cells) + " |")
    first_data = next(iter(seeds.values()))["data"]
    rule = first_data.get("rule", "cosine schedule, a fixed horizon")
    lines += ["", f"Held-out loss at each subset size ({rule}; best of the lrs):", ""]
    lines.append("| seed | " + " | ".join(f"D={d}" for d in mode.data_sizes) + " | monotone? |")
    lines.append("|---|" + "---:|" * len(mode.data_sizes) + "---|")
    for seed, s in seeds.items():
        monotone = s["data"].get("monotone")
        verdict = (
            "—"
            if monotone is None
            else "yes"
            if monotone
            else "NO: " + "; ".join(s["data"]["monotone_violations"])
        )
        cells = [f"{p['loss']:.4f} ({p.get('steps', '?')} st.)" for p in s["data"]["points"]]
        lines.append(f"| {seed} | " + " | ".join(cells) + f" | {verdict} |")
    lines += ["", "Data for each target (the crossing of each seed's L(D)):", ""]
    lines += ["| target loss | per seed | geometric mean | seeds' spread |", "|---:|---|---:|---:|"]
    for t in summary["data_by_target"]:
        per_seed = ", ".join(
            f"{v:,.0f}" if v is not None else str(b)
            for v, b in zip(t["per_seed"], t["bounds"], strict=True)
        )
        mean = "—" if t["examples"] is None else f"{t['examples']:,.0f}"
        spread = "—" if t["spread"] is None else f"×{t['spread']:.2f}"
        lines.append(f"| {t['target_loss']} | {per_seed} | {mean} | {spread} |")
    lines += ["", "## Service beside the truth", ""]
    if service is None:
        lines.append("Service half not run (`--truth-only`).")
    else:
        pool = meta.get("service_train_examples")
        if pool is not None and pool != meta["corpus"]["train_examples"]:
            lines += [
                f"The service got a seeded sample of {pool:,} of the "
                f"{meta['corpus']['train_examples']:,} training examples (`--train-pool`): "
                "its printed data sweep starts from that size.",
                "",
            ]
        lines.append(compare.render(rows))
        lines += compare.data_round_lines(service)
        trend = compare.trend_table(service["analyze"])
        if trend:
            lines += [
                "",
                "Noise scales at the intermediate checkpoints (from the analysis's measurements):",
                "",
                "| checkpoint | step | loss | B_simple | B_noise | examples |",
                "|---|---:|---:|---:|---:|---:|",
            ]
            for t in trend:
                cells = [
                    "—" if t[k] is None else f"{t[k]:.4g}" for k in ("loss", "b_simple", "b_noise")
                ]
                lines.append(
                    f"| {t['checkpoint']} | {t['step']} | {' | '.join(cells)} | {t['n_samples']} |"
                )
        lines += branch.markdown_lines(service, seeds, mode.seq_len)
        counts = {v: sum(r.verdict == v for r in rows) for v in ("yes", "MISSES", "not_available")}
        lines += [
            "",
            f"Within 1.5×: {counts['yes']}; missing the goal: {counts['MISSES']}; "
            f"not_available: {counts['not_available']} (of {len(rows)} rows). A number that "
            "misses 1.5× misses the issue's goal.",
        ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the reduced mode (≤ 10 CPU-min)")
    parser.add_argument(
        "--fresh-truth", action="store_true", help="ignore the cached truth (default: reuse it)"
    )
    parser.add_argument("--truth-only", action="store_true", help="skip the service half")
    parser.add_argument(
        "--jobs", type=int, default=2, help="seeds measured at once, in processes of their own"
    )
    parser.add_argument("--admin-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--workdir", default=None, help="where the uploaded files are written")
    parser.add_argument("--tag", default="", help="suffix of the result files")
    parser.add_argument(
        "--train-pool",
        type=int,
        default=None,
        help="give the service a seeded sample of this many training examples (default: all)",
    )
    parser.add_argument(
        "--max-next-rounds",
        type=int,
        default=2,
        help="next-round data sweeps run as the analyses print them (after the first)",
    )
    parser.add_argument("--load-note", default="", help="say how loaded the machine was")
    parser.add_argument(
        "--rerender", type=Path, default=None, help="rebuild the report of a results JSON"
    )
    parser.add_argument(
        "--only",
        choices=["branch"],
        default=None,
        help="branch: only the branch sweep and the analysis given it, against a cached truth",
    )
    parser.add_argument(
        "--truth",
        type=Path,
        default=None,
        help="the truth cache --only reads (default: the mode's cache in benchmarks/results)",
    )
    args = parser.parse_args()
    if args.rerender is not None:
        rerender(args.rerender)
        return
    mode = QUICK if args.quick else FULL
    if args.only == "branch":
        only_branch(mode, args)
        return
    torch.set_num_threads(1)
    wall0 = time.monotonic()
    cpu0 = cpu_self()
    split, manifest, corpus_hash, eval_np, data = load_data(mode)
    make_model = make_factory(mode)
    cache = TruthCache(mode, corpus_hash, fresh=args.fresh_truth)
    first = min(mode.seeds)
    models: dict = {}
    cached = cache.truth.get("targets")
    targets = None if cached is None else tuple(cached)
    if targets is None or not args.truth_only:
        # seed 0's reference run: the target losses and the checkpoints the service gets
        model, states, ref = reference_run(mode, make_model, data, first)
        models[first] = (model, states)
        if targets is None:
            targets = targets_from_reference(ref, mode)
    target = targets[0]
    print(f"[truth] target losses {targets}; seeds to measure {cache.missing()}", flush=True)
    child_cpu = 0.0
    service = None
    if args.jobs > 1:
        pool, futures = start_truth(mode, cache, targets, args.jobs)
        if not args.truth_only:
            service = service_half(
                mode,
                {"target_loss": target, "targets": list(targets)},
                eval_np,
                data,
                split,
                models,
                args,
            )
        if pool is not None:
            pool.shutdown(wait=True)  # the done-callbacks (cache writes) have run after this
        for future in futures:
            if future.exception() is not None:
                print(f"[truth] a seed failed: {future.exception()!r}", flush=True)
            else:
                child_cpu += future.result()["cpu_s"]
    else:
        for seed in cache.missing():
            cache.add(seed, seed_truth(mode, data, make_model, seed, targets))
        if not args.truth_only:
            service = service_half(
                mode,
                {"target_loss": target, "targets": list(targets)},
                eval_np,
                data,
                split,
                models,
                args,
            )
    truth = cache.truth
    if not truth["seeds"]:
        raise SystemExit("no seed of the ground truth finished")
    truth_cpu_this_run = cpu_self() - cpu0 + child_cpu
    truth_cpu = sum(s["cpu_s"] for s in truth["seeds"].values())
    service_cpu = 0.0 if service is None else service["cpu_s"]
    meta = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.node()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}",
        "load_note": args.load_note
        or f"load average at the end {os.getloadavg()[0]:.1f} (shared machine)",
        "truth_cpu_s": truth_cpu,
        "truth_cpu_s_this_run": truth_cpu_this_run,
        "service_cpu_s": service_cpu,
        "total_cpu_s": truth_cpu_this_run + service_cpu,
        "wall_s": time.monotonic() - wall0,
        "n_parameters": sum(p.numel() for p in make_model(0).parameters()),
        "corpus": {
            "documents": len(manifest["train"]) + len(manifest["validation"]),
            "train_docs": len(manifest["train"]),
            "val_docs": len(manifest["validation"]),
            "train_examples": len(split.train_x),
            "val_examples": len(split.val_x),
            "hash": corpus_hash,
        },
        "service_train_examples": len(service_train(split, args)[0]),
    }
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M")
    stem = f"predictive-{mode.name}-{stamp}{('-' + args.tag) if args.tag else ''}"
    write_report(mode, truth, service, meta, manifest, stem)


def only_branch(mode: Mode, args: argparse.Namespace) -> None:
    """``--only branch``: the branch sweep from the intermediate checkpoints and the analysis
    given it, against a truth cache measured before (no truth is measured here). The uploaded
    files are an earlier run's in ``--workdir`` when they are there (seed 0's reference run is
    deterministic), else the reference run is trained again."""
    torch.set_num_threads(1)
    wall0 = time.monotonic()
    cpu0 = cpu_self()
    path = args.truth or RESULTS / f"predictive-truth-{mode.name}.json"
    truth = json.loads(path.read_text())
    split, manifest, corpus_hash, eval_np, data = load_data(mode)
    matches = truth.get("mode_key") == mode.key() and truth.get("corpus_hash") == corpus_hash
    if not matches:
        print(f"[truth] WARNING: {path} is for other settings or another corpus", flush=True)
    models: dict = {}
    workdir = service_workdir(mode, args)
    if branch.existing_files(workdir, mode.spec()) is None:
        model, states, _ref = reference_run(mode, make_factory(mode), data, min(mode.seeds))
        models[min(mode.seeds)] = (model, states)
    else:
        print(f"[service] uploading the files already in {workdir}", flush=True)
    service = service_half(mode, truth, eval_np, data, split, models, args)
    meta = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.node()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}",
        "load_note": args.load_note
        or f"load average at the end {os.getloadavg()[0]:.1f} (shared machine)",
        "truth_file": str(path),
        "truth_matches_settings": matches,
        "truth_cpu_s": sum(s["cpu_s"] for s in truth["seeds"].values()),
        "truth_cpu_s_this_run": cpu_self() - cpu0,
        "service_cpu_s": service["cpu_s"],
        "total_cpu_s": cpu_self() - cpu0 + service["cpu_s"],
        "wall_s": time.monotonic() - wall0,
        "n_parameters": sum(p.numel() for p in make_factory(mode)(0).parameters()),
        "corpus": {
            "documents": len(manifest["train"]) + len(manifest["validation"]),
            "train_docs": len(manifest["train"]),
            "val_docs": len(manifest["validation"]),
            "train_examples": len(split.train_x),
            "val_examples": len(split.val_x),
            "hash": corpus_hash,
        },
    }
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M")
    stem = f"predictive-branch-{stamp}{('-' + args.tag) if args.tag else ''}"
    write_report(mode, truth, service, meta, manifest, stem)


def comparison_rows(truth: dict, service: dict | None) -> tuple[dict, list[compare.Row]]:
    summary = summarise(truth)
    if service is None:
        return summary, []
    if service.get("only") == "branch":
        rows = compare.budget_rows(
            "analyze (+ branch sweep)", service["analyze_with_sweeps"], summary
        )
        rows += branch.branch_rows(service, summary, truth["target_loss"])
        return summary, with_spread(rows, summary)
    rows = compare.budget_rows("analyze (intermediates)", service["analyze"], summary)
    rows += compare.budget_rows("analyze (+ sweeps)", service["analyze_with_sweeps"], summary)
    rows += compare.further_target_rows(service.get("analyze_at_targets") or {}, summary)
    rows += compare.sweep_rows(service, summary)
    rows += branch.branch_rows(service, summary, truth["target_loss"])
    rows += compare.trend_rows(service["analyze"], summary, truth["target_loss"])
    return summary, with_spread(rows, summary)


def with_spread(rows: list[compare.Row], summary: dict) -> list[compare.Row]:
    """Each row against B_crit or a target's data size gets the truth's seeds' spread there
    (largest over smallest seed), printed beside its ratio."""
    per_seed = [v for v in summary.get("b_crit_per_seed") or [] if v]
    spreads = {}
    if len(per_seed) > 1:
        spreads[summary["b_crit"]] = max(per_seed) / min(per_seed)
    for t in summary.get("data_by_target") or []:
        if t["examples"] is not None:
            spreads[t["examples"]] = t["spread"]
    for r in rows:
        if r.spread is None and r.truth in spreads:
            r.spread = spreads[r.truth]
    return rows


def write_report(
    mode: Mode, truth: dict, service: dict | None, meta: dict, manifest: dict, stem: str
) -> None:
    """``benchmarks/results/<stem>.json`` (everything, the raw service answers included) and
    ``<stem>.md`` (the tables); printed too."""
    summary, rows = comparison_rows(truth, service)
    record = {
        "meta": meta,
        "mode": dataclasses.asdict(mode),
        "target_loss": truth["target_loss"],
        "targets": truth.get("targets") or [truth["target_loss"]],
        "truth_summary": {k: v for k, v in summary.items() if k != "steps_at"},
        "rows": [r.as_dict() for r in rows],
        "service": service,
        "truth": truth["seeds"],
        "corpus_files": manifest,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(
        json.dumps(record, indent=1, default=_json_default) + "\n"
    )
    text = markdown(mode, truth, summary, rows, service, meta)
    (RESULTS / f"{stem}.md").write_text(text)
    print(text)


def rerender(path: Path) -> None:
    """Rebuild the rows and the Markdown of a recorded run from its JSON (no training, no
    service): for a report whose comparison code changed after the run."""
    record = json.loads(path.read_text())
    fields = {f.name for f in dataclasses.fields(Mode)}
    values: dict[str, Any] = {
        k: tuple(v) if isinstance(v, list) else v for k, v in record["mode"].items() if k in fields
    }
    mode = Mode(**values)
    first = next(iter(record["truth"].values()))
    targets = (
        record.get("targets")
        or [n["target_loss"] for n in first["data"].get("needed") or []]
        or [record["target_loss"]]
    )
    truth = {"seeds": record["truth"], "target_loss": record["target_loss"], "targets": targets}
    write_report(mode, truth, record["service"], record["meta"], record["corpus_files"], path.stem)


if __name__ == "__main__":
    main()
