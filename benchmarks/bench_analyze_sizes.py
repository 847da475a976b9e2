"""A default analysis of four models, end to end, stage by stage (docs/numerics.md: real sizes).

Each row runs the curvature engine's ``analyze`` with default options and no request
overrides, wrapped in the worker's :class:`~curvplan_worker.analyze.eta.EtaTracker` (what the
worker's ``measure_engine`` does for an analyze job: the ``cost`` event's estimate, then an
``eta_seconds`` on every progress event), under the worker's memory limit
(``CURVPLAN_WORKER_MEMORY_LIMIT``, else the cgroup's, else MemAvailable; ``--memory-limit``
overrides it). Every row runs in its own child process, so its peak resident memory is its own.

Rows (``--rows``, comma-separated):

* ``example`` — ``curvplan example`` (the 19k-parameter reference Transformer), goal < 30 s;
* ``tiny-gpt2`` — ``curvplan example --arch gpt2`` (a tiny Hugging Face GPT-2), goal < 2 min;
* ``distilgpt2`` — a GPT-2 of distilgpt2's shape (6 layers, 768 wide, 12 heads, vocabulary
  50257, 82 M parameters), random init, 8 × 128 random tokens, goal < 45 min in 24 GiB with
  the first ETA within 25 % of the actual time;
* ``llama`` — a 4-layer Llama, hidden 256 (8 heads, intermediate 688, vocabulary 32000:
  19.5 M parameters), random init, 8 × 128 random tokens, same goal.

It prints, per row: the wall time of every engine stage, products, measured and realised
milliseconds per product, how the spectra were priced (each block's own warm product; the
batched lockstep round where the plan batches), peak RSS (and the engine's own peak), and the
ETA's error (the first ``eta_seconds`` against the time the run actually took after it).

    nice -n 10 python benchmarks/bench_analyze_sizes.py --rows example,tiny-gpt2
    nice -n 10 python benchmarks/bench_analyze_sizes.py --rows llama --json out.json
    python benchmarks/bench_analyze_sizes.py --device cuda
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

ROWS = ("example", "tiny-gpt2", "distilgpt2", "llama")
GOAL_SECONDS = {"example": 30.0, "tiny-gpt2": 120.0, "distilgpt2": 2700.0, "llama": 2700.0}
ETA_GOAL = 0.25
TOKENS, SEQUENCES = 128, 8

if TYPE_CHECKING:
    from curvplan_worker.analyze.eta import EtaTracker

DISTILGPT2_CONFIG: dict[str, Any] = {
    "model_type": "gpt2",
    "architectures": ["GPT2LMHeadModel"],
    "vocab_size": 50257,
    "n_positions": 1024,
    "n_embd": 768,
    "n_layer": 6,
    "n_head": 12,
    "activation_function": "gelu_new",
    "resid_pdrop": 0.0,
    "embd_pdrop": 0.0,
    "attn_pdrop": 0.0,
    "layer_norm_epsilon": 1e-5,
    "tie_word_embeddings": True,
    "bos_token_id": 50256,
    "eos_token_id": 50256,
}
LLAMA_CONFIG: dict[str, Any] = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 32000,
    "max_position_embeddings": 2048,
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


# --------------------------------------------------------------------------- inputs


def _record(eta: EtaTracker) -> dict[str, Any]:
    """The ETA's record as JSON (the keys it set), or {} before the estimate."""
    estimate = eta.record()
    return {} if estimate is None else estimate.model_dump(exclude_unset=True)


def _inputs(row: str, tmp: Path) -> tuple[Any, Any, str]:
    """(model source, checkpoint, data path) of one row, written under ``tmp``."""
    if row == "example":
        from curvplan_worker.curvature.example import write_example

        write_example(tmp)
        spec = json.loads((tmp / "spec.json").read_text())
        return spec, str(tmp / "checkpoint.safetensors"), str(tmp / "data.safetensors")
    if row == "tiny-gpt2":
        from curvplan_worker.curvature.hf_example import write_hf_example
        from curvplan_worker.curvature.sources import read_model_dir

        write_hf_example(tmp, "gpt2", n_eval=64)  # the rows recorded before the Trainer example
        model, shards = read_model_dir(tmp)
        return model, shards, str(tmp / "data.safetensors")
    import torch
    from safetensors.torch import save_file

    config = DISTILGPT2_CONFIG if row == "distilgpt2" else LLAMA_CONFIG
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, config["vocab_size"], (SEQUENCES, TOKENS), generator=gen)
    data = tmp / "data.safetensors"
    save_file({"input_ids": ids, "attention_mask": torch.ones_like(ids)}, str(data))
    # no checkpoint: the engine builds the model from its config, randomly initialised (seed 0)
    return {"source": "huggingface", "config": config}, None, str(data)


def _memory_limit(text: str | None) -> Any:
    from curvplan.types.options import parse_byte_size
    from curvplan_worker.memstats import MemoryLimit, worker_memory_limit

    if text:
        size = parse_byte_size(text)
        assert size is not None
        return MemoryLimit(size, "--memory-limit")
    return worker_memory_limit()


# --------------------------------------------------------------------------- one row
class _EstimateOnly(Exception):
    """Raised at the first spectra event with ``--estimate-only``: the estimate is made."""


def run_row(
    row: str,
    device: str,
    memory_limit: str | None,
    estimate_only: bool = False,
    overrides: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One default analysis in this process; its figures (with ``estimate_only``: up to the
    cost model's estimate, then stop)."""
    import torch

    from curvplan.types.options import MachineSettings, parse_options
    from curvplan_worker.analyze.eta import EtaTracker
    from curvplan_worker.curvature.analyze import analyze
    from curvplan_worker.curvature.limits import AttemptLimits

    with tempfile.TemporaryDirectory(prefix=f"bench-sizes-{row}-") as tmp_dir:
        t0 = time.perf_counter()
        model, checkpoint, data = _inputs(row, Path(tmp_dir))
        prepare = time.perf_counter() - t0
        limit = _memory_limit(memory_limit)
        limits = AttemptLimits(
            memory_limit_bytes=limit.bytes if limit else None,
            memory_limit_source=limit.source if limit else "",
            started_at=time.monotonic(),
        )
        # the defaults (or the --option overrides), typed: what the tracker estimates with
        options = parse_options(overrides or {})
        eta = EtaTracker(limits, options)
        events: list[dict[str, Any]] = []
        t_start = time.perf_counter()

        def progress(event: Any) -> None:
            seconds = eta.update(event)
            if estimate_only and eta.estimate is not None and event.stage != "cost":
                raise _EstimateOnly
            if not events or events[-1]["stage"] != event.stage:
                events.append(
                    {
                        "stage": event.stage,
                        "at": round(time.perf_counter() - t_start, 2),
                        "eta_seconds": seconds,
                        "products": event.products,
                    }
                )
                print(
                    f"  [{row}] {events[-1]['at']:8.1f} s  {event.stage:<15} "
                    f"products={event.products} eta={seconds}",
                    file=sys.stderr,
                    flush=True,
                )

        try:
            result = analyze(
                model,
                checkpoint,
                data,
                options,
                progress=progress,
                machine=MachineSettings(device=device),
                limits=limits,
            )
        except _EstimateOnly:
            record = _record(eta)
            return {
                "row": row,
                "estimate_only": True,
                "seconds_to_estimate": round(time.perf_counter() - t_start, 2),
                "estimated_seconds": record.get("seconds"),
                "estimated_products": record.get("products"),
                "first_eta_seconds": eta.first_eta,
                "estimate_stages": record.get("stages"),
                "measured": record.get("measured", {}),
                "stage_seconds": record.get("stage_seconds", {}),
                "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                "threads": torch.get_num_threads(),
            }
        wall = time.perf_counter() - t_start
    record = _record(eta)
    products = max((e["products"] or 0 for e in events), default=0)
    stage_products: dict[str, int] = {}
    for first, second in itertools.pairwise(events):
        stage_products[first["stage"]] = (second["products"] or 0) - (first["products"] or 0)
    stage_seconds = record.get("stage_seconds", {})
    measured = record.get("measured", {})
    spectra_s = stage_seconds.get("blocks", 0.0)
    spectra_p = stage_products.get("blocks", 0)
    return {
        "row": row,
        "options": overrides or {},
        "device": result.get("device"),
        "n_parameters": result.get("n_parameters"),
        "n_examples": result.get("n_examples"),
        "blocks": len(result.get("blocks") or []),
        "prepare_seconds": round(prepare, 2),
        "wall_seconds": round(wall, 2),
        "stage_seconds": stage_seconds,
        "stage_products": stage_products,
        "products": products,
        "estimated_products": record.get("products"),
        "estimated_seconds": record.get("seconds"),
        "ms_per_product_measured": measured.get("ms_per_product"),
        "ms_per_product_spectra": round(1000 * spectra_s / spectra_p, 2) if spectra_p else None,
        "ms_per_product_overall": round(1000 * wall / products, 2) if products else None,
        "first_eta_seconds": record.get("first_eta_seconds"),
        "actual_seconds_after_first_eta": record.get("actual_seconds_after_first_eta"),
        "eta_relative_error": record.get("eta_relative_error"),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "engine_peak_memory_bytes": result.get("peak_memory_bytes"),
        "engine_peak_memory_source": result.get("peak_memory_source"),
        "memory_limit_bytes": limits.memory_limit_bytes,
        "memory_limit_source": limits.memory_limit_source,
        "micro_batch": result.get("eval_batch_size"),
        "threads": torch.get_num_threads(),
        "converged_blocks": sum(1 for b in result.get("blocks") or [] if b.get("converged")),
        "block_products": {
            b["name"]: (b.get("n_products"), b.get("restarts"), b.get("basis_vectors"))
            for b in result.get("blocks") or []
        },
        "lockstep": (result.get("memory_plan") or {}).get("lockstep"),
        "later_stage_memory": (result.get("memory_plan") or {}).get("stages"),
        "noise_hvp_products": (result.get("gradient_noise") or {}).get("n_hvp_products"),
        "estimate_stages": record.get("stages"),
        "per_sample_hessian_products": (
            ((result.get("per_sample") or {}).get("hessian_norms") or {}).get("n_products")
        ),
        "measured": measured,
    }


# --------------------------------------------------------------------------- the table
def _gib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**30:.2f} GiB"


def _print_row(r: dict[str, Any]) -> None:
    goal = GOAL_SECONDS[r["row"]]
    err = r.get("eta_relative_error")
    print(
        f"\n{r['row']}: {r['n_parameters']:,} parameters, {r['n_examples']} examples, "
        f"{r['blocks']} blocks ({r['converged_blocks']} with λ_max and λ_min certified), "
        f"{r['device']}, {r['threads']} threads, micro-batch {r['micro_batch']}"
    )
    if r.get("options"):
        print(f"  options {r['options']} (not the default analysis the goal is for)")
    print(f"  inputs written in {r['prepare_seconds']:.1f} s (not counted)")
    for stage, seconds in r["stage_seconds"].items():
        products = r["stage_products"].get(stage)
        extra = f"  {products} products" if products else ""
        print(f"  {stage:<16} {seconds:9.2f} s{extra}")
    print(
        f"  wall {r['wall_seconds']:.1f} s (goal < {goal:.0f} s: "
        f"{'met' if r['wall_seconds'] < goal else 'missed'}, "
        f"ratio {r['wall_seconds'] / goal:.2f} of the goal)"
    )
    print(
        f"  products {r['products']} (estimated {r['estimated_products']}), ms/product: "
        f"measured before the spectra {r['ms_per_product_measured']}, in the spectra "
        f"{r['ms_per_product_spectra']}, overall {r['ms_per_product_overall']}"
    )
    print(
        f"  peak RSS {_gib(r['peak_rss_bytes'])}; engine peak {_gib(r['engine_peak_memory_bytes'])}"
        f" ({r['engine_peak_memory_source']}); limit {_gib(r['memory_limit_bytes'])} "
        f"({r['memory_limit_source']})"
    )
    spectra = (r.get("measured") or {}).get("spectra") or {}
    stages = {s["stage"]: s for s in r.get("estimate_stages") or []}
    if spectra:
        items = spectra.get("item_ms") or {}
        lo, hi = (min(items.values()), max(items.values())) if items else (0.0, 0.0)
        est = sum(stages[s]["seconds"] for s in ("blocks", "off_diagonal") if s in stages)
        how = (
            f"batched, {spectra.get('round_vectors')} vectors in "
            f"{spectra.get('round_ms', 0):.1f} ms, 1 in {spectra.get('one_vector_ms', 0):.1f} ms"
            if spectra.get("batched")
            else "one product per vector"
        )
        print(
            f"  spectra priced as they run ({how}): {len(items)} items timed alone, "
            f"{lo:.2f}-{hi:.2f} ms a product; estimated {est:.1f} s, took "
            f"{r['stage_seconds'].get('blocks', 0):.1f} s"
        )
    if err is None:
        print("  ETA: none reported")
    else:
        print(
            f"  ETA: first {r['first_eta_seconds']} s, actual {r['actual_seconds_after_first_eta']}"
            f" s after it: error {100 * err:+.1f} % (goal |error| < {100 * ETA_GOAL:.0f} %: "
            f"{'met' if abs(err) < ETA_GOAL else 'missed'})"
        )


def _print_estimate(r: dict[str, Any]) -> None:
    stages = ", ".join(f"{s['stage']} {s['seconds']:.0f} s" for s in r.get("estimate_stages") or [])
    seconds = r.get("estimated_seconds") or 0.0
    print(
        f"\n{r['row']}: estimate only, made after {r['seconds_to_estimate']:.1f} s "
        f"({r['threads']} threads): {r.get('estimated_products') or 0:.0f} products, "
        f"{seconds:.0f} s ({seconds / 60:.1f} min): {stages}; first ETA "
        f"{r.get('first_eta_seconds')} s; peak RSS so far {_gib(r['peak_rss_bytes'])}"
    )


def _overrides(pairs: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` analysis options (VALUE parsed as JSON, else a string)."""
    out: dict[str, Any] = {}
    for raw in pairs:
        key, sep, value = raw.partition("=")
        if not sep or not key.strip():
            raise SystemExit(f"--option {raw!r}: expected KEY=VALUE")
        try:
            out[key.strip()] = json.loads(value)
        except ValueError:
            out[key.strip()] = value
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog=(
            "Every row runs, the large ones too: --rows distilgpt2 and --rows llama build the "
            "model from its config (random init, seed 0) on 8 x 128 random tokens; each takes "
            "minutes to hours on a 2-core CPU (see benchmarks/results/analyze-sizes-cpu.txt "
            "for the estimates), so run them on a quiet machine, e.g. "
            "OMP_NUM_THREADS=1 nice -n 10 python benchmarks/bench_analyze_sizes.py "
            "--rows llama --memory-limit 24GiB --json out.json"
        ),
    )
    parser.add_argument(
        "--rows", default=",".join(ROWS), help=f"comma-separated, any of {ROWS} (default: all)"
    )
    parser.add_argument("--device", default="cpu", help="cpu | cuda")
    parser.add_argument("--memory-limit", default=None, help="e.g. 24GiB (default: the worker's)")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    parser.add_argument(
        "--estimate-only",
        action="store_true",
        help="run each row up to the cost model's estimate (load, gradient, the timed "
        "products), print it and stop before the spectra: what a full row would take",
    )
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an analysis option instead of its default (VALUE as JSON), repeatable; e.g. "
        "--option 'blocks=[\"final_norm\"]' runs every stage after the spectra at full size "
        "on one small block (such a row is not the default analysis its goal is for)",
    )
    parser.add_argument("--one-row", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    overrides = _overrides(args.option)
    if args.one_row:  # the child process of one row: its figures as JSON on the last line
        row = run_row(args.one_row, args.device, args.memory_limit, args.estimate_only, overrides)
        print(json.dumps(row))
        return
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = sorted(set(rows) - set(ROWS))
    if unknown:
        raise SystemExit(f"--rows: unknown {unknown}; choose from {ROWS}")
    print(f"load average before: {os.getloadavg()}, {os.cpu_count()} CPUs", flush=True)
    results = []
    for row in rows:
        cmd = [sys.executable, __file__, "--one-row", row, "--device", args.device]
        if args.memory_limit:
            cmd += ["--memory-limit", args.memory_limit]
        if args.estimate_only:
            cmd += ["--estimate-only"]
        cmd += [f"--option={o}" for o in args.option]
        t0 = time.perf_counter()
        done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
        if done.returncode != 0:
            print(
                f"\n{row}: FAILED (exit {done.returncode}) after {time.perf_counter() - t0:.0f} s"
            )
            results.append({"row": row, "failed": done.returncode})
            continue
        r = json.loads(done.stdout.strip().splitlines()[-1])
        r["load_average_after"] = os.getloadavg()
        if r.get("estimate_only"):
            _print_estimate(r)
        else:
            _print_row(r)
        print(f"  load average after: {r['load_average_after']}", flush=True)
        results.append(r)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
