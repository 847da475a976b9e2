"""Curvature-engine commands that run without the service: ``curvature`` and ``example``.

torch is imported inside the command bodies only: ``import curvplan`` stays light.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer


def _fail(message: str) -> typer.Exit:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    return typer.Exit(code=2)


def curvature(
    spec: Optional[Path] = typer.Option(None, "--spec", help="model spec JSON"),  # noqa: UP045
    checkpoint: Optional[Path] = typer.Option(  # noqa: UP045
        None, "--checkpoint", help="safetensors checkpoint (w*) of --spec"
    ),
    model_dir: Optional[Path] = typer.Option(  # noqa: UP045
        None,
        "--model",
        help="Hugging Face save_pretrained directory (config.json + safetensors shards)",
    ),
    data: Path = typer.Option(
        ...,
        "--data",
        help="safetensors sample: inputs, targets (--spec) or input_ids[, attention_mask]"
        "[, labels] (--model)",
    ),
    out: Path = typer.Option(..., "--out", help="where to write the result JSON"),
    options: Optional[Path] = typer.Option(  # noqa: UP045 (typer needs Optional)
        None, "--options", help="JSON file of AnalysisOptions (flags below override it)"
    ),
    blocks: Optional[list[str]] = typer.Option(  # noqa: UP045
        None, "--block", help="block-name pattern (repeatable), e.g. 'layers.0.*'"
    ),
    tolerance: Optional[float] = typer.Option(None, help="relative residual tolerance"),  # noqa: UP045
    max_iter: Optional[int] = typer.Option(None, help="Lanczos steps per block"),  # noqa: UP045
    top_k: Optional[int] = typer.Option(None, help="top-k eigenvalues per block"),  # noqa: UP045
    off_diagonal: Optional[bool] = typer.Option(  # noqa: UP045
        None, "--off-diagonal/--no-off-diagonal", help="σ_max of every off-diagonal block pair"
    ),
    trace_probes: Optional[int] = typer.Option(None, help="Hutch++ products per block"),  # noqa: UP045
    ggn: Optional[bool] = typer.Option(None, "--ggn/--no-ggn", help="GGN and functional parts"),  # noqa: UP045
    dense: Optional[str] = typer.Option(None, help="auto | on | off"),  # noqa: UP045
    precision: Optional[str] = typer.Option(None, help="float32 | float64"),  # noqa: UP045
    device: str = typer.Option("auto", help="auto | cpu | cuda[:index]"),
    seed: Optional[int] = typer.Option(None, help="seed of every probe vector"),  # noqa: UP045
    eval_batch_size: Optional[int] = typer.Option(None, help="examples per batch"),  # noqa: UP045
    per_sample: Optional[bool] = typer.Option(None, "--per-sample/--no-per-sample"),  # noqa: UP045
    gradient_noise: Optional[bool] = typer.Option(  # noqa: UP045
        None, "--gradient-noise/--no-gradient-noise"
    ),
    bounds: Optional[bool] = typer.Option(None, "--bounds/--no-bounds"),  # noqa: UP045
    threads: Optional[int] = typer.Option(None, help="torch intra-op threads"),  # noqa: UP045
    self_test: bool = typer.Option(
        True, "--self-test/--no-self-test", help="check HVPs against finite differences first"
    ),
    cache_graph: bool = typer.Option(
        True, "--cache-graph/--no-cache-graph", help="keep the gradient graph between products"
    ),
    memory_budget: Optional[str] = typer.Option(  # noqa: UP045
        None, "--memory-budget", help="bytes the products may use, e.g. 8GiB"
    ),
    quiet: bool = typer.Option(False, "--quiet", help="no progress lines"),
) -> None:
    """Blockwise Hessian spectra, traces, bounds and per-sample statistics of a checkpoint."""
    if (spec is None) == (model_dir is None):
        raise _fail("give either --spec with --checkpoint, or --model DIR")
    if spec is not None and checkpoint is None:
        raise _fail("--spec needs --checkpoint")
    opts: dict = {}
    if options is not None:
        try:
            opts = json.loads(options.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise _fail(f"--options {options}: {exc}") from None
        if not isinstance(opts, dict):
            raise _fail(f"--options {options}: expected a JSON object")
    flags = {
        "blocks": blocks or None,
        "tolerance": tolerance,
        "max_iter": max_iter,
        "top_k": top_k,
        "off_diagonal": off_diagonal,
        "trace_probes": trace_probes,
        "ggn": ggn,
        "dense": dense,
        "precision": precision,
        "seed": seed,
        "eval_batch_size": eval_batch_size,
        "per_sample": per_sample,
        "gradient_noise": gradient_noise,
        "bounds": bounds,
    }
    opts.update({k: v for k, v in flags.items() if v is not None})

    from pydantic import ValidationError

    from curvplan.types.options import MachineSettings
    from curvplan.types.spec import SpecError, load_spec
    from curvplan_worker.curvature.analyze import Cancelled, OptionsError, analyze

    try:
        machine = MachineSettings.model_validate(
            {
                "device": device,
                "threads": threads,
                "self_test": self_test,
                "cache_graph": cache_graph,
                "memory_budget": memory_budget,  # "8GiB" or bytes
            }
        )
    except ValidationError as exc:
        raise _fail(str(exc)) from None
    from curvplan_worker.curvature.checkpoint import CheckpointError, CheckpointMismatch
    from curvplan_worker.curvature.data import DataError
    from curvplan_worker.curvature.hf import HFModelError
    from curvplan_worker.curvature.sources import read_model_dir

    def progress(event) -> None:
        if not quiet:
            typer.echo(f"[{event.fraction * 100:5.1f}%] {event.stage}: {event.message}", err=True)

    try:
        source: Any
        if model_dir is not None:
            source, shards = read_model_dir(model_dir)
        else:
            assert spec is not None  # checked with the option parsing above
            source, shards = load_spec(spec), [str(checkpoint)]
        result = analyze(source, shards, str(data), opts, progress=progress, machine=machine)
    except (
        SpecError,
        HFModelError,
        OptionsError,
        CheckpointMismatch,
        CheckpointError,
        DataError,
    ) as exc:
        raise _fail(str(exc)) from None
    except Cancelled as exc:
        raise _fail(str(exc)) from None
    except ValueError as exc:  # other bad input (device unavailable, block patterns, bounds)
        raise _fail(str(exc)) from None
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, allow_nan=False) + "\n")
    _print_summary(result)
    typer.echo(f"wrote {out}")


def _print_summary(result: dict) -> None:
    limited = (result.get("precision_limited") or {}).get("reason")
    if limited:
        typer.echo(f"precision limited: {limited}")
    typer.echo(
        f"loss {result['loss']:.6g}  |grad| {result['gradient_norm']:.3e}  "
        f"{result['n_parameters']} parameters, {result['n_examples']} examples, "
        f"{result['device']} {result['dtype']}"
    )
    typer.echo(
        f"{'block':<22}{'lambda_max':>13}{'lambda_min':>13}{'trace':>12}  conv  attained  products"
    )
    for b in result["blocks"]:
        trace = (b.get("trace") or {}).get("value")
        trace_s = f"{trace:12.4e}" if trace is not None else f"{'-':>12}"
        typer.echo(
            f"{b['name']:<22}{b['lambda_max']:13.5e}{b['lambda_min']:13.5e}{trace_s}  "
            f"{'yes' if b['converged'] else 'NO ':<4}  {b['attained_tolerance']:8.1e}"
            f"  {b['n_products']}"
        )


def example(
    out: Path = typer.Option(..., "--out", help="directory to write the example into"),
    steps: int = typer.Option(300, help="Adam steps"),
    seed: int = typer.Option(0, help="seed of the language, the model and the data"),
    save_steps: int = typer.Option(
        50, "--save-steps", min=1, help="gpt2 | llama: a Trainer checkpoint every N steps"
    ),
    arch: str = typer.Option(
        "reference",
        "--arch",
        help="reference (spec.json + checkpoint) | gpt2 | llama (a Hugging Face Trainer run "
        "folder: checkpoint-<step> subfolders and the final save_pretrained model)",
    ),
) -> None:
    """Train a tiny model offline on a Markov-chain language and write it with its data."""
    if arch in ("gpt2", "llama"):
        from curvplan_worker.curvature.hf_example import write_hf_example

        run = write_hf_example(out, arch, steps=steps, seed=seed, save_steps=save_steps)
        typer.echo(
            f"trained a {arch} of {run['n_parameters']} parameters for {run['steps']} "
            f"steps with the Hugging Face Trainer: eval loss {run['eval_loss']:.4f} "
            f"(entropy rate {run['entropy_rate']:.4f}, uniform "
            f"{run['uniform_loss']:.4f})"
        )
        typer.echo(
            f"wrote the run folder {out}: {', '.join(run['checkpoints'])} (the Trainer's "
            f"saves, trainer_state.json in each), config.json + model.safetensors (the final "
            f"model), data.safetensors (input_ids, attention_mask), train.safetensors "
            f"({run['n_train']} sequences, for sweeps); try: curvplan analyze --model {out} "
            f"--data {out}/data.safetensors --wait"
        )
        return
    if arch != "reference":
        raise _fail(f"--arch: expected reference, gpt2 or llama, got {arch!r}")
    from curvplan_worker.curvature.example import write_example

    summary = write_example(out, steps=steps, seed=seed)
    typer.echo(
        f"trained {summary['n_parameters']} parameters for {summary['steps']} steps: "
        f"eval loss {summary['eval_loss']:.4f} (entropy rate {summary['entropy_rate']:.4f}, "
        f"uniform {summary['uniform_loss']:.4f})"
    )
    typer.echo(
        f"wrote {out}/spec.json, checkpoint.safetensors, data.safetensors; try: "
        f"curvplan curvature --spec {out}/spec.json --checkpoint {out}/checkpoint.safetensors "
        f"--data {out}/data.safetensors --out {out}/result.json"
    )


def register(app: typer.Typer) -> None:
    """Attach the engine commands to the top-level app."""
    app.command("curvature")(curvature)
    app.command("example")(example)
