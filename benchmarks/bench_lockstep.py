"""Lockstep block spectra against the sequential path and hessian-eigenthings, side by side.

Models: the reference example (``curvplan example``: 2 pre-LN layers, d_model 32, vocabulary
16, 64 × 32 tokens) and the tiny Hugging Face GPT-2 (``curvplan example --arch gpt2``), each
trained as the CLI trains it. For every model, in ONE run, on the CPU, one thread, each method
in a fresh subprocess (so its peak resident memory is its own):

* ``lockstep``: every block's thick-restart Lanczos advancing together, one batched second
  backward per round (``curvature/lockstep.py``), planned as ``analyze`` plans it;
* ``sequential``: the same Lanczos (bounded basis), one block after another, one product at a
  time (``spectra.block_spectrum``);
* ``unbounded``: today's algorithm before the bounded basis: sequential Lanczos with a full
  float64 basis of ``max_iter`` + 1 vectors (what the engine did before this change);
* ``eigenthings``: hessian-eigenthings 1.0.0a5 (``benchmarks/bench_curvature.py``'s adapter:
  block-restricted double-backward HVPs, its ``lanczos(k=1)`` once for LA and once for SA,
  a fixed number of steps per end: it has no early stop). At equal accuracy (the default
  ``--peer-protocol``): per block and end, the fewest steps of a ladder (10, 20, …, 320) whose
  value is within our error of the float64 reference (or within ``--tol``, whichever is
  looser): an oracle's tuning, the peer's best case; and the same peer with ONE step count for
  every block (the fewest reaching every end), as a user must run it. ``--peer-protocol fixed``
  runs ``min(--peer-max-iter, n − 1)`` steps per end instead. It runs in the peer venv
  (``benchmarks/setup_peers.sh``, or any venv with hessian-eigenthings, transformers and the
  pinned torch: ``--peer-python``); without it the column is skipped.

All methods measure λ_max and λ_min of the same blocks (the default blocks; GPT-2's q/k/v
column slices of ``c_attn`` are merged into one whole-tensor ``qkv`` block, since the peer
restricts to whole tensors) on the same evaluation sample and the same mean token loss. Each
method's error is the worst over blocks and ends of |λ − λ_ref| / max(|λ_ref|, 10⁻³‖H_B‖) against
a float64 reference at ``--reference-tol`` (sequential Lanczos with the unbounded basis).

    .venv/bin/python benchmarks/bench_lockstep.py [--precision float32] [--tol 1e-4]
        [--peer-python .bench-venv/bin/python] [--json benchmarks/results/lockstep-cpu.json]

Figures per method: wall seconds to every block's λ_max and λ_min, products (operator
products: Lanczos steps and the explicit residual checks), products per second, second
backwards (the batched ones count once), peak resident memory and its increase over the
process's resident memory before the spectra.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for sub in ("workers", "app", ""):
    path = str(ROOT / sub) if sub else str(ROOT)
    if path not in sys.path:
        sys.path.insert(0, path)

METHODS = ("lockstep", "sequential", "unbounded", "eigenthings")


def _rss_bytes() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _peak_rss_bytes() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def write_examples(directory: Path) -> dict[str, dict]:
    """The two example models as the CLI writes them; returns how to load each."""
    from curvplan_worker.curvature.example import EXAMPLE_SPEC, write_example
    from curvplan_worker.curvature.hf_example import write_hf_example

    ref, gpt2 = directory / "example", directory / "gpt2"
    if not (ref / "checkpoint.safetensors").exists():
        write_example(ref, checkpoint_steps=())
    if not (gpt2 / "model.safetensors").exists():
        write_hf_example(gpt2, "gpt2", n_eval=64)  # as recorded before
    config = json.loads((gpt2 / "config.json").read_text())
    return {
        "example": {
            "spec": EXAMPLE_SPEC,
            "checkpoint": str(ref / "checkpoint.safetensors"),
            "data": str(ref / "data.safetensors"),
        },
        "gpt2": {
            "spec": {"source": "huggingface", "config": config},
            "checkpoint": str(gpt2 / "model.safetensors"),
            "data": str(gpt2 / "data.safetensors"),
        },
    }


def whole_tensor_blocks(blocks: dict[str, list[str]]) -> dict[str, list[str]]:
    """Blocks over whole tensors: sliced members (GPT-2's q/k/v of c_attn) merged into one
    block per tensor set, named ``<prefix>qkv``."""
    from curvplan_worker.curvature.operator import parse_member

    out: dict[str, list[str]] = {}
    for name, members in blocks.items():
        parsed = [parse_member(m) for m in members]
        if not any(p.is_slice for p in parsed):
            out[name] = list(members)
            continue
        bases = list(dict.fromkeys(p.name for p in parsed))
        if bases in out.values():
            continue
        prefix = name.rsplit(".", 1)[0] + "." if "." in name else ""
        out[f"{prefix}qkv"] = bases
    return out


def _load(model: dict, dtype):
    from curvplan_worker.curvature.blocks import default_blocks
    from curvplan_worker.curvature.sources import load_source, parse_model

    source = load_source(
        parse_model(model["spec"]), model["checkpoint"], model["data"], dtype=dtype, seed=0
    )
    module = source.module.to(dtype=dtype)
    data = source.data.to("cpu", dtype)
    blocks = whole_tensor_blocks(source.default_blocks or default_blocks(module))
    return source, module, data, blocks


def child(args: argparse.Namespace) -> dict:
    """One method on one model in this process (the parent runs each in a fresh one)."""
    import torch

    torch.set_num_threads(1)
    model = json.loads(args.model_json)
    dtype = torch.float64 if args.precision == "float64" else torch.float32
    source, module, data, blocks = _load(model, dtype)
    sizes: dict[str, int] = {}
    if args.method == "eigenthings":
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from bench_curvature import peer_eigenthings

        x, y = data.inputs, data.targets
        for name, members in blocks.items():
            sizes[name] = sum(dict(module.named_parameters())[m].numel() for m in members)
        before = _rss_bytes()
        cpu0 = time.process_time()
        if args.targets:
            targets = json.loads(Path(args.targets).read_text())
            out = peer_ladder(module, x, y, blocks, targets, args.tol, args.peer_max_iter)
            out.update(ladder_cpu_seconds=time.process_time() - cpu0, rss_before=before)
            out.update(peak_rss=_peak_rss_bytes(), sizes=sizes)
            return out
        out = peer_eigenthings(module, x, y, blocks, args.tol, args.peer_max_iter, lambda: None)
        return {
            "seconds": out["seconds"],
            "cpu_seconds": time.process_time() - cpu0,
            "products": out["products"],
            "backwards": out["products"],
            "values": {k: list(v) for k, v in out["values"].items()},
            "converged": out["converged"],
            "rss_before": before,
            "peak_rss": _peak_rss_bytes(),
            "sizes": sizes,
        }

    from curvplan_worker.curvature.lockstep import Lockstep, Task
    from curvplan_worker.curvature.memory import plan_lockstep
    from curvplan_worker.curvature.memory_fit import fit_to_memory
    from curvplan_worker.curvature.operator import CurvatureEngine
    from curvplan_worker.curvature.spectra import (
        basis_bytes,
        basis_dtype,
        basis_vectors,
        block_spectrum,
        block_steps,
        lanczos_spectrum,
    )

    batches = data.batches(source.micro_batch(None))
    values: dict[str, list[float]] = {}
    detail: dict[str, dict] = {}
    with CurvatureEngine(module, source.objective, batches) as eng:
        plan = fit_to_memory(eng, None, "unbounded", True)
        for name, members in blocks.items():
            sizes[name] = eng.layout(members).numel
        eng.gradient()  # warm: the graphs are built by the first product of every method
        before = _rss_bytes()
        products0 = eng.n_hvp
        started = time.perf_counter()
        cpu0 = time.process_time()
        backwards = 0
        kw = {"tol": args.tol, "max_iter": args.max_iter, "floor": 1e-3}
        if args.method == "lockstep":
            itemsize = torch.empty((), dtype=basis_dtype(eng.dtype)).element_size()
            tasks = []
            for i, (name, members) in enumerate(blocks.items()):
                gen = torch.Generator().manual_seed(1000 + i)
                steps = block_steps(eng, members, generator=gen, **kw)
                m = basis_vectors(sizes[name], None, itemsize, 2)
                tasks.append(Task(name, steps, basis_bytes(sizes[name], m, itemsize)))
            n_union = sum(p.numel() for p in eng.params.values())
            lplan = plan_lockstep(plan, [t.basis_bytes for t in tasks], n_union, itemsize, None)
            runner = Lockstep(
                eng,
                vectors_per_product=lplan.vectors_per_product,
                basis_room=lplan.basis_room_bytes,
            )
            results = runner.run(tasks)
            backwards = runner.stats.backwards
            detail["lockstep"] = runner.stats.as_dict()
        else:
            results = {}
            for i, (name, members) in enumerate(blocks.items()):
                gen = torch.Generator().manual_seed(1000 + i)
                if args.method == "sequential":
                    results[name] = block_spectrum(eng, members, generator=gen, **kw)
                else:  # the unbounded float64 basis of the engine before this change
                    results[name] = lanczos_spectrum(
                        lambda v, m=members: eng.block_hvp(m, v),
                        sizes[name],
                        generator=gen,
                        basis=args.max_iter + 1,
                        **kw,
                    )
            backwards = eng.n_hvp - products0
        seconds = time.perf_counter() - started
        cpu_seconds = time.process_time() - cpu0
        products = eng.n_hvp - products0
    for name, spec in results.items():
        values[name] = [spec.lambda_max, spec.lambda_min]
        detail[name] = {
            "products": spec.n_products,
            "iterations": spec.iterations,
            "restarts": spec.restarts,
            "restarts_for_min": spec.restarts_for_min,
            "basis_vectors": spec.basis_vectors,
            "converged": spec.converged,
        }
    converged = sum(bool(d.get("converged")) for d in detail.values() if "converged" in d)
    return {
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "products": products,
        "backwards": backwards,
        "values": values,
        "converged": f"{converged}/{len(results)} blocks",
        "rss_before": before,
        "peak_rss": _peak_rss_bytes(),
        "sizes": sizes,
        "detail": detail,
        "memory_plan": plan.as_dict(),
    }


LADDER = (10, 20, 40, 80, 160, 320)
"""Fixed Lanczos step counts tried, in order, for the peer at equal accuracy."""


def peer_ladder(module, x, y, blocks, targets: dict, tol: float, cap: int) -> dict:
    """hessian-eigenthings at equal accuracy, block by block and end by end.

    The peer has no stopping test: its ``lanczos`` runs a fixed ``max_iter`` steps. For each
    block and end this tries the step counts of :data:`LADDER` (capped at ``cap`` and n − 1)
    in order and keeps the first whose value is within the target error of the float64
    reference: ``targets[block] = [[ref_max, ref_min], [err_max, err_min]]``, where the
    target error is ours on that end or the tolerance, whichever is larger. That is an
    oracle's tuning (a user cannot know the steps a block needs), so it is the peer's best
    case; the CPU seconds of the reaching run are its cost (the ladder's other runs are
    reported, not counted). An end the cap does not reach counts the cap's run, and the row
    says so: its ratio is then a lower bound."""
    import hessian_eigenthings as he
    import torch

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_curvature import _FlatLM

    flat = _FlatLM(module).eval()
    loader = [(x, y.reshape(-1))]
    loss_fn = he.supervised_loss(torch.nn.functional.cross_entropy)
    per_end: dict[str, list[dict]] = {}
    ops = {}
    for name, members in blocks.items():
        wanted = [f"model.{m}" for m in members]
        op = he.HessianOperator(
            flat, loader, loss_fn, param_filter=he.match_names(*wanted), method="autograd"
        )
        (ref_hi, ref_lo), (err_hi, err_lo) = targets[name]
        norm = max(abs(ref_hi), abs(ref_lo))
        rows = []
        for which, ref, target in (("LA", ref_hi, err_hi), ("SA", ref_lo, err_lo)):
            limit = min(cap, op.size - 1)
            rungs = sorted({min(r, limit) for r in LADDER if r <= limit} | {limit})
            tried = []
            for steps in rungs:
                c0 = time.process_time()
                res = he.lanczos(op, k=1, which=which, max_iter=steps, tol=tol, seed=0)
                cpu = time.process_time() - c0
                value = float(res.eigenvalues[0])
                err = abs(value - ref) / max(abs(ref), 1e-3 * norm)
                tried.append({"steps": steps, "cpu_seconds": cpu, "value": value, "error": err})
                if err <= target:
                    break
            last = tried[-1]
            rows.append(
                {
                    **last,
                    "reached": last["error"] <= target,
                    "target": target,
                    "ladder_cpu_seconds": sum(t["cpu_seconds"] for t in tried),
                }
            )
        per_end[name] = rows
        ops[name] = op
    reached = [e for rows in per_end.values() for e in rows]
    # the same peer with ONE step count for every block and end: the fewest that reached all
    global_steps = max(e["steps"] for e in reached)
    global_cpu, global_values = 0.0, {}
    for name, rows in per_end.items():
        op = ops[name]
        steps = min(global_steps, op.size - 1)
        pair = []
        for which, row in zip(("LA", "SA"), rows, strict=True):
            if row["steps"] == steps:
                global_cpu += row["cpu_seconds"]
                pair.append(row["value"])
                continue
            c0 = time.process_time()
            res = he.lanczos(op, k=1, which=which, max_iter=steps, tol=tol, seed=0)
            global_cpu += time.process_time() - c0
            pair.append(float(res.eigenvalues[0]))
        global_values[name] = pair
    return {
        "seconds": sum(e["cpu_seconds"] for e in reached),
        "cpu_seconds": sum(e["cpu_seconds"] for e in reached),
        "products": sum(e["steps"] for e in reached),
        "backwards": sum(e["steps"] for e in reached),
        "values": {k: [rows[0]["value"], rows[1]["value"]] for k, rows in per_end.items()},
        "converged": f"{sum(e['reached'] for e in reached)}/{len(reached)} ends reached",
        "ends": per_end,
        "global_steps": global_steps,
        "global_cpu_seconds": global_cpu,
        "global_values": global_values,
        "all_reached": all(e["reached"] for e in reached),
    }


def _run_child(
    python: str,
    model: dict,
    method: str,
    args,
    precision: str,
    tol: float,
    targets: str | None = None,
) -> dict:
    cmd = [
        python,
        str(Path(__file__).resolve()),
        "--child",
        method,
        "--model-json",
        json.dumps(model),
        "--precision",
        precision,
        "--tol",
        repr(tol),
        "--max-iter",
        str(args.max_iter if method != "reference" else args.reference_max_iter),
        "--peer-max-iter",
        str(args.peer_max_iter),
    ]
    if targets is not None:
        cmd += ["--targets", targets]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "workers"), str(ROOT / "app"), str(ROOT), env.get("PYTHONPATH", "")]
    )
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1:] or ["failed"]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _end_errors(values: dict, reference: dict) -> dict[str, list[float]]:
    """Per block, the error of λ_max and λ_min: |λ − λ_ref| / max(|λ_ref|, 10⁻³‖H_B‖)."""
    out = {}
    for name, (hi, lo) in reference["values"].items():
        got = values.get(name)
        norm = max(abs(hi), abs(lo))
        out[name] = [
            abs(g - r) / max(abs(r), 1e-3 * norm) if got is not None else float("nan")
            for g, r in zip(got or (None, None), (hi, lo), strict=True)
        ]
    return out


def _errors(values: dict, reference: dict) -> float:
    worst = 0.0
    for errs in _end_errors(values, reference).values():
        if any(e != e for e in errs):
            return float("nan")
        worst = max(worst, *errs)
    return worst


def peer_targets(values: dict, reference: dict, tol: float) -> dict:
    """The peer's per-end targets at equal accuracy (:func:`peer_ladder`): per block, the
    reference values and our error on each end or ``tol``, whichever is larger."""
    return {
        name: [list(reference["values"][name]), [max(e, tol) for e in errs]]
        for name, errs in _end_errors(values, reference).items()
    }


def _write_targets(ours: dict, reference: dict, tol: float, directory: Path) -> str:
    path = directory / "peer-targets.json"
    path.write_text(json.dumps(peer_targets(ours["values"], reference, tol)))
    return str(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--child", choices=[*METHODS, "reference"], help=argparse.SUPPRESS)
    parser.add_argument("--model-json", help=argparse.SUPPRESS)
    parser.add_argument("--models", default="example,gpt2")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--precision", default="float32", choices=["float32", "float64"])
    parser.add_argument("--tol", type=float, default=1e-4)
    parser.add_argument("--reference-tol", type=float, default=1e-9)
    parser.add_argument("--max-iter", type=int, default=300)
    parser.add_argument("--reference-max-iter", type=int, default=1500)
    parser.add_argument(
        "--peer-max-iter",
        type=int,
        default=None,
        help="the peer's steps (fixed protocol, default 100) or the ladder's cap (default 320)",
    )
    parser.add_argument(
        "--peer-protocol",
        choices=["equal-accuracy", "fixed"],
        default="equal-accuracy",
        help="equal-accuracy: the peer's fewest ladder steps reaching our error per block and "
        "end (--peer-max-iter caps the ladder); fixed: --peer-max-iter steps for every end",
    )
    parser.add_argument("--targets", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--peer-python", default=str(ROOT / ".bench-venv" / "bin" / "python"))
    parser.add_argument("--examples", default=None, help="folder for the example models")
    parser.add_argument("--json", default=None)
    parser.add_argument("--show", default=None, help="print the tables of a --json file")
    args = parser.parse_args()
    if args.peer_max_iter is None:
        args.peer_max_iter = LADDER[-1] if args.peer_protocol == "equal-accuracy" else 100
    if args.show:
        saved = json.loads(Path(args.show).read_text())
        for name, model in saved["models"].items():
            _print(name, model["reference"], model["methods"])
        return
    if args.child:
        # the reference: today's unbounded float64 basis (a bounded basis pays restarts for
        # λ_min at a tight tolerance), float64 products
        args.method = "unbounded" if args.child == "reference" else args.child
        print(json.dumps(child(args)))
        return
    directory = Path(args.examples or tempfile.mkdtemp(prefix="bench-lockstep-"))
    models = write_examples(directory)
    report: dict = {
        "precision": args.precision,
        "tol": args.tol,
        "max_iter": args.max_iter,
        "peer_max_iter": args.peer_max_iter,
        "peer_protocol": args.peer_protocol,
        "threads": 1,
        "models": {},
    }
    for model_name in args.models.split(","):
        model = models[model_name]
        reference = _run_child(
            sys.executable, model, "reference", args, "float64", args.reference_tol
        )
        rows = {}
        for method in args.methods.split(","):
            python = sys.executable
            if method == "eigenthings":
                if not Path(args.peer_python).exists():
                    rows[method] = {"error": [f"no peer venv at {args.peer_python}"]}
                    continue
                python = args.peer_python
            targets = None
            if method == "eigenthings" and args.peer_protocol == "equal-accuracy":
                ours = rows.get("lockstep") or rows.get("sequential")
                if ours is None or "error" in ours or "values" not in reference:
                    rows[method] = {"error": ["equal accuracy needs the reference and lockstep"]}
                    continue
                targets = _write_targets(ours, reference, args.tol, directory)
            rows[method] = _run_child(
                python, model, method, args, args.precision, args.tol, targets
            )
        report["models"][model_name] = {"reference": reference, "methods": rows}
        _print(model_name, reference, rows)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str) + "\n")


def _cpu(row: dict) -> float:
    """CPU seconds of the spectra (wall seconds where not recorded): on a shared, loaded
    machine the process's CPU time is the fairer measure of its own work."""
    return float(row.get("cpu_seconds", row["seconds"]))


def _print(model_name: str, reference: dict, rows: dict) -> None:
    sizes = reference.get("sizes", {})
    print(f"\n== {model_name}: {len(sizes)} blocks, {sum(sizes.values())} parameters in blocks")
    ok = {m: r for m, r in rows.items() if "error" not in r}
    fastest_peer = min((_cpu(r) for m, r in ok.items() if m == "eigenthings"), default=float("nan"))
    lock = _cpu(ok["lockstep"]) if "lockstep" in ok else float("nan")
    header = (
        f"{'method':<12} {'wall s':>8} {'CPU s':>8} {'products':>9} {'prod/CPU s':>10} "
        f"{'backwards':>9} "
        f"{'peak MiB':>9} {'+MiB':>7} {'worst err':>10} {'converged':>12} {'CPU/lockstep':>12}"
    )
    print(header)
    for method, r in rows.items():
        if "error" in r:
            print(f"{method:<12} error: {r['error']}")
            continue
        rate = r["products"] / max(_cpu(r), 1e-12)
        err = _errors(r["values"], reference) if "values" in reference else float("nan")
        print(
            f"{method:<12} {r['seconds']:8.2f} {_cpu(r):8.2f} {r['products']:9d} {rate:10.1f} "
            f"{r['backwards']:9d} {r['peak_rss'] / 2**20:9.1f} "
            f"{(r['peak_rss'] - r['rss_before']) / 2**20:7.1f} {err:10.2e} "
            f"{r['converged']:>12} {_cpu(r) / lock:10.2f}x"
        )
    if fastest_peer == fastest_peer:
        print(
            f"lockstep speed-up over the fastest peer (hessian-eigenthings): "
            f"{fastest_peer / lock:.2f}x"
        )
    peer = ok.get("eigenthings")
    if peer and "ends" in peer and lock == lock:
        _print_ladder(peer, sizes, lock)
    seq = ok.get("sequential")
    unb = ok.get("unbounded")
    if seq and unb:
        print("planned basis vs unbounded, per block: products, restarts_for_min")
        for name in seq["values"]:
            s, u = seq["detail"][name], unb["detail"][name]
            print(
                f"  {name:<28} n={sizes.get(name, 0):>6} planned {s['products']:>4} "
                f"(restarts {s['restarts']}, for λ_min {s['restarts_for_min']})  "
                f"unbounded {u['products']:>4}"
            )


def _print_ladder(peer: dict, sizes: dict, lock: float) -> None:
    """The peer at equal accuracy: per block and end, the steps that reached our error; then
    the same peer with ONE step count for every block (how it is used: it has no stopping
    test), the fewest that reached every end, measured."""
    print("peer at equal accuracy (hessian-eigenthings, fewest ladder steps reaching our error):")
    print(f"  {'block':<20} {'n':>6}  {'LA steps':>8} {'CPU s':>6} {'SA steps':>8} {'CPU s':>6}")
    for name, (hi, lo) in peer["ends"].items():
        flag = "" if hi["reached"] and lo["reached"] else "  (cap not enough: lower bound)"
        print(
            f"  {name:<20} {sizes.get(name, 0):>6}  {hi['steps']:>8} {hi['cpu_seconds']:6.2f} "
            f"{lo['steps']:>8} {lo['cpu_seconds']:6.2f}{flag}"
        )
    steps = peer["global_steps"]
    bound = "" if peer["all_reached"] else " (some end not reached at the cap: a lower bound)"
    print(
        f"peer tuned per block by an oracle: {_cpu(peer):.2f} CPU s -> lockstep speed-up "
        f"{_cpu(peer) / lock:.2f}x{bound}"
    )
    glob = peer["global_cpu_seconds"]
    print(
        f"peer with one step count for every block ({steps} steps, the fewest reaching every "
        f"end; measured): {glob:.2f} CPU s -> lockstep speed-up {glob / lock:.2f}x{bound}"
    )


if __name__ == "__main__":
    main()
