"""Client commands that talk to a running curvplan service.

``analyze``, ``plan``, ``jobs list|show|cancel|wait``, ``recommendations``, ``report``.
The service is ``--url``/``$CURVPLAN_URL`` and the key ``--api-key``/``$CURVPLAN_API_KEY``.
Progress goes to stderr (a live bar on a terminal, plain lines otherwise); results go
to stdout as tables, or as JSON with ``--json``.

Exit codes: 0 success · 1 the job failed or was cancelled · 2 bad input (usage, file,
422) · 3 the service failed or could not be reached · 4 ``--wait`` timed out ·
130 interrupted (the job keeps running; ``curvplan jobs cancel ID`` stops it).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, cast

import typer

from curvplan.commands import command_group

if TYPE_CHECKING:
    from pydantic import JsonValue

    from curvplan.client import Client
    from curvplan.client.models import JobOut
    from curvplan.client.pretrained import HuggingFaceModelJson
    from curvplan.commands.import_runs import PlanDocument, RunSource
    from curvplan.runs.tables import RunsReport

EXIT_OK, EXIT_JOB_FAILED, EXIT_BAD_INPUT, EXIT_SERVICE, EXIT_TIMEOUT = 0, 1, 2, 3, 4
EXIT_INTERRUPTED = 130

jobs_app = command_group(help="List, show, wait for and cancel jobs.", no_args_is_help=True)

URL_OPTION = typer.Option(
    None, "--url", envvar="CURVPLAN_URL", help="Service URL [default: http://127.0.0.1:8000]."
)
KEY_OPTION = typer.Option(
    None, "--api-key", envvar="CURVPLAN_API_KEY", help="API key (sent as a Bearer token)."
)
JSON_OPTION = typer.Option(False, "--json", help="Print JSON on stdout (for scripts).")
TAG_OPTION = typer.Option(None, "--tag", help="KEY=VALUE label; repeatable.")
MLFLOW_OPTION = typer.Option(
    False,
    "--mlflow",
    help="Log the finished job to MLflow: the active run, $MLFLOW_RUN_ID, or a new run in "
    "$MLFLOW_EXPERIMENT_NAME (default curvplan) on $MLFLOW_TRACKING_URI. Needs curvplan[mlflow].",
)


# --------------------------------------------------------------------------- helpers
def _fail(message: str, code: int) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


@contextmanager
def _client(url: str | None, api_key: str | None) -> Iterator[Client]:
    """A client, with every client error turned into a message and an exit code."""
    from curvplan.client import Client, CurvplanError, WaitTimeoutError
    from curvplan.client.errors import (
        ConnectionFailedError,
        ServerError,
        ValidationFailedError,
    )

    try:
        client = Client(url, api_key)
    except ValueError as exc:
        raise _fail(str(exc), EXIT_BAD_INPUT) from None
    try:
        yield client
    except WaitTimeoutError as exc:
        job = exc.job
        hint = f"; see `curvplan jobs show {job.id}`" if job is not None else ""
        raise _fail(f"{exc.detail}{hint}", EXIT_TIMEOUT) from None
    except (ConnectionFailedError, ServerError) as exc:
        raise _fail(str(exc), EXIT_SERVICE) from None
    except ValidationFailedError as exc:
        lines = [str(exc.detail or exc)]
        lines += [f"  {e.get('field')}: {e.get('message')}" for e in exc.errors or []]
        raise _fail("\n".join(lines), EXIT_BAD_INPUT) from None
    except CurvplanError as exc:
        code = EXIT_BAD_INPUT if exc.status is not None and exc.status < 500 else EXIT_SERVICE
        raise _fail(str(exc), code) from None
    except (ValueError, FileNotFoundError) as exc:
        raise _fail(str(exc), EXIT_BAD_INPUT) from None
    finally:
        client.close()


def _split_pairs(values: list[str] | None, option: str) -> list[tuple[str, str]]:
    out = []
    for raw in values or []:
        key, sep, value = raw.partition("=")
        if not sep or not key.strip():
            raise _fail(f"{option} {raw!r} must look like KEY=VALUE", EXIT_BAD_INPUT)
        out.append((key.strip(), value))
    return out


def _pairs(values: list[str] | None, option: str) -> dict[str, str]:
    """``KEY=VALUE`` options as a dict (a key given twice keeps its last value)."""
    return dict(_split_pairs(values, option))


def _json_pairs(values: list[str] | None, option: str) -> dict[str, JsonValue]:
    """``KEY=VALUE`` options whose values are JSON (a bare word is a string)."""
    out: dict[str, JsonValue] = {}
    for key, value in _split_pairs(values, option):
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value  # a bare word is a string
    return out


def _read_json(path: Path, option: str) -> Any:
    try:
        text = sys.stdin.read() if str(path) == "-" else path.read_text()
    except OSError as exc:
        raise _fail(
            f"{option}: cannot read {path}: {exc.strerror or exc}", EXIT_BAD_INPUT
        ) from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise _fail(f"{option}: {path} is not valid JSON: {exc}", EXIT_BAD_INPUT) from None


JOB_REF_HELP = "A job id, or a job name (the newest job of that name)."


def _job_ref(client: Client, value: str, option: str, kind: str | None = None) -> str:
    """A job id, or a job name: the newest job of that name (succeeded, of ``kind``, when a
    kind is asked for), so that a script can name what it submitted with ``--name``."""
    import uuid as _uuid

    try:
        return str(_uuid.UUID(value))
    except ValueError:
        pass
    page = client.list_jobs(
        name=value, kind=kind, status="succeeded" if kind else None, page_size=1
    )
    if not page.items:
        what = f"succeeded {kind} job" if kind else "job"
        raise _fail(
            f"{option}: {value!r} is neither a job id nor the name of a {what}", EXIT_BAD_INPUT
        )
    return str(page.items[0].id)


def _print_json(value: Any) -> None:
    from curvplan.client.models import dump_json

    typer.echo(json.dumps(dump_json(value), indent=2, ensure_ascii=False))


class RunsEnvelope(TypedDict):
    """What ``plan --from-* --json`` prints around the job: the runs it used."""

    runs: RunsReport


def _print_job_json(job: JobOut, envelope: RunsEnvelope | None) -> None:
    """The job as JSON, or ``{**envelope, "job": job}`` (e.g. ``plan --from-*``'s runs)."""
    _print_json(job if envelope is None else {**envelope, "job": job.model_dump(mode="json")})


WEBHOOK_OPTION = typer.Option(
    None,
    "--webhook-url",
    help="POST a signed event to this URL when the job ends (see `curvplan webhooks`).",
)
OUTPUTS_OPTION = typer.Option(
    None,
    "--outputs",
    help="Append KEY=VALUE lines (job_id, status and the budget: samples, batch_size, "
    "critical_batch_size, gd_sharpness_threshold, …) to this file, e.g. $GITHUB_OUTPUT.",
)


def _write_outputs(client: Client, job: JobOut, path: Path) -> None:
    """The job's id, status and budget as ``KEY=VALUE`` lines for a pipeline's next step."""
    from curvplan.client import models as m
    from curvplan.headline import headline_numbers

    lines = {"job_id": str(job.id), "status": job.status, "kind": job.kind}
    rec = m.job_recommendation(job)
    if rec is not None:
        for h in headline_numbers(rec):
            if h.name.startswith("budget."):
                value = int(h.value) if float(h.value).is_integer() else h.value
                lines[h.name.removeprefix("budget.")] = str(value)
    lines["report"] = f"{client.base_url}/v1/jobs/{job.id}/report"
    try:
        with path.open("a", encoding="utf-8") as fh:
            fh.writelines(f"{k}={v}\n" for k, v in lines.items())
    except OSError as exc:
        raise _fail(
            f"--outputs: cannot write {path}: {exc.strerror or exc}", EXIT_BAD_INPUT
        ) from None


def _log_to_mlflow(client: Client, job_id: str, quiet: bool) -> None:
    from curvplan.integrations.mlflow import MlflowNotInstalledError, log_job

    try:
        run_id = log_job(client, job_id)
    except MlflowNotInstalledError as exc:
        raise _fail(f"--mlflow: {exc}", EXIT_BAD_INPUT) from None
    except Exception as exc:  # MLflow's own errors (unreachable server, bad run id, …)
        raise _fail(f"--mlflow: logging to MLflow failed: {exc}", EXIT_SERVICE) from None
    if not quiet:
        typer.echo(f"logged job {job_id} to MLflow run {run_id}", err=True)


def _finish(
    client: Client,
    job: JobOut,
    wait: bool,
    timeout: float | None,
    as_json: bool,
    quiet: bool,
    mlflow: bool = False,
    outputs: Path | None = None,
    envelope: RunsEnvelope | None = None,
) -> None:
    """Wait (with progress on stderr) if asked, print the outcome, exit by the job's status.
    ``envelope``: with --json, print ``{**envelope, "job": job}`` instead of the job."""
    from curvplan.client import display

    if (mlflow or outputs is not None) and not wait:
        raise _fail("--mlflow and --outputs need a finished job: add --wait", EXIT_BAD_INPUT)
    if not wait:
        if as_json:
            _print_job_json(job, envelope)
        else:
            typer.echo(f"submitted job {job.id} ({job.status})")
            typer.echo(f"follow it with: curvplan jobs wait {job.id}")
        return
    if not as_json and not quiet:
        typer.echo(f"job {job.id} submitted", err=True)
    progress = None if quiet else display.ProgressDisplay(sys.stderr)
    try:
        job = client.wait(job.id, timeout=timeout, on_progress=progress)
    except KeyboardInterrupt:
        if progress is not None:
            progress.close()
        raise _fail(
            f"interrupted; job {job.id} keeps running (cancel: curvplan jobs cancel {job.id})",
            EXIT_INTERRUPTED,
        ) from None
    if outputs is not None:
        _write_outputs(client, job, outputs)
    if mlflow:
        _log_to_mlflow(client, str(job.id), quiet or as_json)
    _report_outcome(client, job, as_json, envelope)


def _report_outcome(
    client: Client, job: JobOut, as_json: bool, envelope: RunsEnvelope | None = None
) -> None:
    from curvplan.client import display

    if as_json:
        _print_job_json(job, envelope)
    elif job.status == "succeeded":
        branch = display.sweep_text(job)
        if branch is not None:
            typer.echo(branch + "\n")
        typer.echo(display.recommendation_text(client.get_recommendation(job.id)))
        typer.echo(f"\nreport: curvplan report {job.id} --open")
    else:
        typer.echo(display.job_summary(job))
    if job.status != "succeeded":
        reason = f": {job.error.type}: {job.error.detail or job.error.title}" if job.error else ""
        typer.echo(f"error: job {job.id} {job.status}{reason}", err=True)
        raise typer.Exit(EXIT_JOB_FAILED)


# --------------------------------------------------------------------------- analyze / plan
def analyze(
    model_dir: Path | None = typer.Option(
        None,
        "--model",
        help="A save_pretrained directory (config.json + safetensors shards): GPT-2, Llama, "
        "Mistral, Qwen2 causal LMs; or a Hugging Face Trainer output folder (checkpoint-<step> "
        "subfolders: the last is w*, the earlier ones the intermediate checkpoints with their "
        "step and logged loss). Replaces --spec/--checkpoint.",
    ),
    w_star: str | None = typer.Option(
        None,
        "--w-star",
        help="With --model RUN_DIR: the checkpoint that is w* (checkpoint-300, or 300) "
        "[default: the last]; the earlier ones are the intermediates.",
    ),
    spec: Path | None = typer.Option(
        None, "--spec", help="Reference model spec JSON (see the engine contract)."
    ),
    checkpoint: list[Path] | None = typer.Option(
        None, "--checkpoint", help="Weights at w* (.safetensors) for --spec; repeat per shard."
    ),
    data: Path = typer.Option(
        ...,
        "--data",
        help="Evaluation sample (.safetensors): inputs/targets, or input_ids "
        "[+ attention_mask] [+ labels].",
    ),
    name: str | None = typer.Option(None, "--name", help="Label to find the job by."),
    tag: list[str] | None = TAG_OPTION,
    option: list[str] | None = typer.Option(
        None, "--option", help="Analysis option KEY=VALUE (VALUE parsed as JSON); repeatable."
    ),
    targets: Path | None = typer.Option(None, "--targets", help="Planner targets JSON file."),
    intermediate: list[Path] | None = typer.Option(
        None,
        "--intermediate",
        help="Checkpoint before convergence (for the gradient-noise scale): a file, or a "
        "save_pretrained directory with --model; repeatable.",
    ),
    sweep: list[str] | None = typer.Option(
        None,
        "--sweep",
        help="A succeeded sweep job whose fit the budget uses, by id or name (the newest "
        "succeeded sweep of that name); repeatable.",
    ),
    devices: int | None = typer.Option(
        None,
        "--devices",
        min=1,
        help="Run on this many data-parallel devices of one worker (resources.devices).",
    ),
    wait: bool = typer.Option(False, "--wait", help="Wait for the result, with progress."),
    timeout: float | None = typer.Option(
        None, "--timeout", min=0, help="Give up waiting after S s."
    ),
    idempotency_key: str | None = typer.Option(None, "--idempotency-key"),
    as_json: bool = JSON_OPTION,
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress output."),
    mlflow: bool = MLFLOW_OPTION,
    outputs: Path | None = OUTPUTS_OPTION,
    webhook_url: str | None = WEBHOOK_OPTION,
    url: str | None = URL_OPTION,
    api_key: str | None = KEY_OPTION,
) -> None:
    """Upload a model's weights and data, run the curvature analysis and plan on the service.

    Either --model DIR (a Hugging Face save_pretrained directory) or --spec with --checkpoint.
    """
    model: Any
    ckpt: Any = None
    if model_dir is not None:
        if spec is not None or checkpoint:
            raise _fail(
                "--model DIR brings its own config and weights: drop --spec/--checkpoint",
                EXIT_BAD_INPUT,
            )
        _check_model_dir(model_dir, w_star, bool(intermediate))  # fails before any upload
        model = model_dir
    else:
        if spec is None or not checkpoint:
            raise _fail(
                "give --model DIR (a save_pretrained directory), or --spec with --checkpoint",
                EXIT_BAD_INPUT,
            )
        if w_star is not None:
            raise _fail("--w-star names a checkpoint of --model RUN_DIR", EXIT_BAD_INPUT)
        model = _read_json(spec, "--spec")
        if not isinstance(model, dict):
            raise _fail("--spec: the model spec must be a JSON object", EXIT_BAD_INPUT)
        ckpt = checkpoint[0] if len(checkpoint) == 1 else list(checkpoint)
    paths = [(p, "--checkpoint") for p in checkpoint or []] + [(data, "--data")]
    for path, opt in paths:
        if not path.is_file():
            raise _fail(f"{opt}: file not found: {path}", EXIT_BAD_INPUT)
    for path in intermediate or []:
        if not (path.is_file() or (model_dir is not None and path.is_dir())):
            raise _fail(f"--intermediate: not found: {path}", EXIT_BAD_INPUT)
    target_body = _read_json(targets, "--targets") if targets is not None else None
    tags = _pairs(tag, "--tag")
    options = _json_pairs(option, "--option")
    with _client(url, api_key) as client:
        log = (lambda s: None) if as_json or quiet else (lambda s: typer.echo(s, err=True))
        job = client.submit_analyze(
            model,
            ckpt,
            data,
            name=name,
            tags=tags,
            options=options or None,
            targets=target_body,
            intermediate_checkpoints=list(intermediate or []),
            sweeps=[_job_ref(client, v, "--sweep", kind="sweep") for v in sweep or []],
            idempotency_key=idempotency_key,
            webhook_url=webhook_url,
            on_upload=lambda path: log(f"uploading {path} …"),
            devices=devices,
            w_star=w_star,
        )
        _finish(client, job, wait, timeout, as_json, quiet, mlflow, outputs)


def _check_model_dir(model_dir: Path, w_star: str | None, intermediates: bool) -> None:
    """``--model DIR`` read and checked before anything is uploaded: a Trainer output folder
    (its checkpoints, trainer_state.json files and architectures) or a save_pretrained
    directory (its config and shards)."""
    from curvplan.client.pretrained import PretrainedDirError, read_pretrained
    from curvplan.client.trainer_run import is_trainer_run, read_trainer_run

    try:
        if is_trainer_run(model_dir):
            if intermediates:
                raise _fail(
                    "--intermediate: the run folder's checkpoint-<step> subfolders before w* "
                    "are the intermediate checkpoints; drop --intermediate",
                    EXIT_BAD_INPUT,
                )
            run = read_trainer_run(model_dir, w_star)
            steps = ", ".join(str(c.step) for c in run.intermediates) or "none"
            typer.echo(
                f"run folder {model_dir}: w* = {run.w_star.name}; intermediate checkpoints at "
                f"steps {steps}",
                err=True,
            )
            return
        if w_star is not None:
            raise _fail(
                f"--w-star: {model_dir} is not a Trainer output folder (no checkpoint-<step> "
                "subfolders)",
                EXIT_BAD_INPUT,
            )
        read_pretrained(model_dir)  # refused configs and stale shards fail before uploads
    except PretrainedDirError as exc:
        raise _fail(f"--model: {exc}", EXIT_BAD_INPUT) from None


def _ints(value: str | None, opt: str) -> list[int] | None:
    if value is None:
        return None
    try:
        return [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise _fail(
            f"{opt}: expected comma-separated integers, got {value!r}", EXIT_BAD_INPUT
        ) from None


def _sweep_model(
    spec: Path | None, model_dir: Path | None
) -> HuggingFaceModelJson | dict[str, JsonValue]:
    """The sweep's ``model``: a reference spec file, or a save_pretrained directory's config."""
    if (spec is None) == (model_dir is None):
        raise _fail(
            "give --spec (a model spec JSON) or --model DIR (a save_pretrained directory)",
            EXIT_BAD_INPUT,
        )
    if model_dir is not None:
        from curvplan.client.pretrained import PretrainedDirError, read_pretrained
        from curvplan.client.trainer_run import is_trainer_run, read_trainer_run

        try:
            if is_trainer_run(model_dir):  # the architecture of its last checkpoint
                return read_trainer_run(model_dir).model
            return read_pretrained(model_dir).model
        except PretrainedDirError as exc:
            raise _fail(f"--model: {exc}", EXIT_BAD_INPUT) from None
    assert spec is not None
    model = _read_json(spec, "--spec")
    if not isinstance(model, dict):
        raise _fail("--spec: the model spec must be a JSON object", EXIT_BAD_INPUT)
    return model


def optimizer_state_beside(checkpoint: Path) -> Path | None:
    """``step_25.optimizer.safetensors`` beside ``step_25.safetensors``: the AdamW moments a
    branch sweep starts that checkpoint's branches from (None: no such file)."""
    candidate = checkpoint.with_name(f"{checkpoint.stem}.optimizer.safetensors")
    return candidate if candidate.is_file() else None


def sweep(
    spec: Path | None = typer.Option(None, "--spec", help="Model spec JSON."),
    model_dir: Path | None = typer.Option(
        None,
        "--model",
        help="A save_pretrained directory or a Trainer output folder (as `analyze --model` "
        "takes them): its config.json (the last checkpoint's) is the architecture; training "
        "starts from a seeded initialisation (or --checkpoint), not from the trained weights. "
        "Replaces --spec.",
    ),
    train: Path | None = typer.Option(
        None, "--train", help="Training data (.safetensors); not with --runner agent."
    ),
    evaluation: Path | None = typer.Option(
        None, "--eval", help="Held-out evaluation data; not with --runner agent."
    ),
    sweep_type: str = typer.Option("batch", "--type", help="batch | data | branch"),
    runner: str = typer.Option(
        "builtin",
        "--runner",
        help="builtin: the service's workers train each point on --spec/--model, --train and "
        "--eval; agent: `curvplan agent` processes of the project run your own training "
        "command for each point (docs/budget.md#sweeps-with-your-own-trainer).",
    ),
    checkpoint: list[Path] | None = typer.Option(
        None,
        "--checkpoint",
        help="Start checkpoint (default: a seeded initialisation). Branch sweep: repeat it, "
        "one per checkpoint to branch from (e.g. the run's step_<n> saves, step_25.safetensors); "
        "an AdamW state saved beside one as <name>.optimizer.safetensors is sent with it.",
    ),
    target_loss: float | None = typer.Option(
        None, "--target-loss", help="Eval loss (nats per token) to train to / size data for."
    ),
    batch_sizes: str | None = typer.Option(None, "--batch-sizes", help="e.g. 8,16,32,64"),
    data_sizes: str | None = typer.Option(None, "--data-sizes", help="e.g. 256,512,1024"),
    batch_size: int = typer.Option(32, "--batch-size", help="Data sweep: batch (examples)."),
    max_steps: int | None = typer.Option(
        None,
        "--max-steps",
        help="Step cap of a run (default: 2000; data sweep: 50000, the epoch rule's cap).",
    ),
    epochs: float | None = typer.Option(
        None, "--epochs", help="Data sweep: passes over each subset (default 10)."
    ),
    min_steps: int | None = typer.Option(
        None, "--min-steps", help="Data sweep: the fewest steps of a run (default 200)."
    ),
    max_rounds: int | None = typer.Option(
        None,
        "--max-rounds",
        help="Data sweep: the most rounds (default 3); a later round halves below or doubles "
        "above the measured sizes until they bracket the target.",
    ),
    max_runs: int | None = typer.Option(
        None,
        "--max-runs",
        help="Data sweep: the most training runs over all rounds, lr grid included (default 36).",
    ),
    eval_every: int = typer.Option(5, "--eval-every"),
    optimizer: str = typer.Option("adamw", "--optimizer", help="adamw | sgd"),
    lr: float = typer.Option(3e-3, "--lr", help="Learning rate at --base-batch-size."),
    base_batch_size: int = typer.Option(32, "--base-batch-size"),
    warmup_steps: int = typer.Option(10, "--warmup-steps"),
    lr_rule: str = typer.Option("sqrt", "--lr-rule", help="sqrt | linear | constant | grid"),
    seed: int = typer.Option(0, "--seed", help="Initialisation and batch-order seed."),
    window_tokens: int | None = typer.Option(
        None, "--window-tokens", help="Branch sweep: tokens each branch trains from its checkpoint."
    ),
    window_evals: int = typer.Option(4, "--window-evals", help="Branch sweep: evaluations."),
    tolerance: float = typer.Option(
        0.01, "--tolerance", help="Branch sweep: ε (nats) a batch may trail the smallest by."
    ),
    compare: str = typer.Option(
        "end", "--compare", help="Branch sweep: end (of the window) | window (throughout)."
    ),
    moment_warmup_steps: int = typer.Option(
        20,
        "--moment-warmup-steps",
        help="Branch sweep: steps at learning rate 0 that warm the optimizer's moments on each "
        "branch's batches (checkpoints without an optimizer state beside them).",
    ),
    checkpoint_steps: str | None = typer.Option(
        None,
        "--checkpoint-steps",
        help="Branch sweep: each checkpoint's training step, e.g. 25,50,100 (default: the "
        "step each file declares).",
    ),
    name: str | None = typer.Option(None, "--name"),
    tag: list[str] | None = TAG_OPTION,
    wait: bool = typer.Option(False, "--wait", help="Wait for the result, with progress."),
    timeout: float | None = typer.Option(None, "--timeout", min=0),
    idempotency_key: str | None = typer.Option(None, "--idempotency-key"),
    as_json: bool = JSON_OPTION,
    quiet: bool = typer.Option(False, "--quiet", "-q"),
    mlflow: bool = MLFLOW_OPTION,
    outputs: Path | None = OUTPUTS_OPTION,
    webhook_url: str | None = WEBHOOK_OPTION,
    url: str | None = URL_OPTION,
    api_key: str | None = KEY_OPTION,
) -> None:
    """Run a batch, data or branch sweep on the workers (one child job per training run).

    Either --spec (a reference model) or --model DIR (a Hugging Face save_pretrained directory).
    A branch sweep (Merrill et al. 2025) branches from every --checkpoint at each of
    --batch-sizes for --window-tokens and gives the critical batch size at each checkpoint.
    With --runner agent no model or data is uploaded: `curvplan agent --command '…'` runs your
    training command for each point.
    """
    agent = runner == "agent"
    if runner not in ("builtin", "agent"):
        raise _fail(f"--runner: builtin or agent, got {runner!r}", EXIT_BAD_INPUT)
    if agent:
        given = [
            o
            for o, v in (
                ("--spec", spec),
                ("--model", model_dir),
                ("--train", train),
                ("--eval", evaluation),
                ("--checkpoint", checkpoint),
            )
            if v
        ]
        if given:
            raise _fail(
                f"{', '.join(given)}: an agent sweep trains with your own command on its own "
                "model and data; drop them (or use --runner builtin)",
                EXIT_BAD_INPUT,
            )
    model = None if agent else _sweep_model(spec, model_dir)
    checkpoints = list(checkpoint or [])
    for path, opt in ((train, "--train"), (evaluation, "--eval")):
        if agent:
            break
        if path is None:
            raise _fail(f"{opt}: required (or --runner agent)", EXIT_BAD_INPUT)
        if not path.is_file():
            raise _fail(f"{opt}: file not found: {path}", EXIT_BAD_INPUT)
    for path in checkpoints:
        if not path.is_file():
            raise _fail(f"--checkpoint: file not found: {path}", EXIT_BAD_INPUT)
    branch = sweep_type == "branch"
    if len(checkpoints) > 1 and not branch:
        raise _fail(
            "--checkpoint: a batch or data sweep starts from one checkpoint; repeat it only "
            "for --type branch",
            EXIT_BAD_INPUT,
        )
    settings: dict[str, object] = {
        "type": sweep_type,
        "eval_every": eval_every,
        "batch_size": batch_size,
        "init_seed": seed,
    }
    optional = {
        "max_steps": max_steps,
        "epochs": epochs,
        "min_steps": min_steps,
        "max_rounds": max_rounds,
        "max_runs": max_runs,
    }
    settings |= {key: value for key, value in optional.items() if value is not None}
    if target_loss is not None:
        settings["target_loss"] = target_loss
    if batch_sizes is not None:
        settings["batch_sizes"] = _ints(batch_sizes, "--batch-sizes")
    if data_sizes is not None:
        settings["data_sizes"] = _ints(data_sizes, "--data-sizes")
    if branch:
        settings |= {
            "window_evals": window_evals,
            "tolerance": tolerance,
            "compare": compare,
            "moment_warmup_steps": moment_warmup_steps,
        }
        if window_tokens is not None:
            settings["window_tokens"] = window_tokens
        if checkpoint_steps is not None:
            settings["checkpoint_steps"] = _ints(checkpoint_steps, "--checkpoint-steps")
    with _client(url, api_key) as client:
        log = (lambda s: None) if as_json or quiet else (lambda s: typer.echo(s, err=True))
        body: dict[str, object] = {
            "kind": "sweep",
            "optimizer": {
                "name": optimizer,
                "lr": lr,
                "base_batch_size": base_batch_size,
                "warmup_steps": warmup_steps,
                "lr_rule": lr_rule,
            },
            "sweep": settings,
        }
        if agent:
            body["runner"] = "agent"
        else:
            body["model"] = model
        start = checkpoints[0] if checkpoints and not branch else None
        uploads: list[tuple[Path | None, str, str]] = [
            (train, "train_data", "dataset"),
            (evaluation, "eval_data", "dataset"),
            (start, "checkpoint", "checkpoint"),
        ]
        if name is not None:
            body["name"] = name
        tags = _pairs(tag, "--tag")
        if tags:
            body["tags"] = tags
        if webhook_url is not None:
            body["webhook_url"] = webhook_url
        # The body is checked with placeholder ids before any file is sent (a bad flag or
        # --type fails at once, naming the field, as the service's 422 would).
        from curvplan.client import precheck

        placeholders = precheck.placeholder_ids(p for p, _, _ in uploads if p is not None)
        placeholders |= precheck.placeholder_ids(checkpoints)
        checked: dict[str, object] = {k: placeholders[p] for p, k, _ in uploads if p is not None}
        if branch:
            checked["checkpoints"] = [placeholders[p] for p in checkpoints]
        precheck.validate_job_body({**body, **checked})
        for source, key, kind in uploads:
            if source is not None:
                log(f"uploading {source} …")
                body[key] = str(client.upload_artifact(source, kind).id)
        if branch:
            ids, states = [], []
            for ckpt in checkpoints:
                log(f"uploading {ckpt} …")
                ids.append(str(client.upload_artifact(ckpt, "checkpoint").id))
                beside = optimizer_state_beside(ckpt)
                if beside is not None:
                    log(f"uploading its optimizer state {beside} …")
                states.append(
                    None if beside is None else str(client.upload_artifact(beside, "checkpoint").id)
                )
            body["checkpoints"] = ids
            if any(states):
                body["optimizer_states"] = states
        job = client.submit_job(body, idempotency_key=idempotency_key)
        log(f"sweep job {job.id}: use it with `curvplan analyze … --sweep {job.id}`")
        if agent:
            log("its points wait for `curvplan agent --command '…'` (a key of this project)")
        _finish(client, job, wait, timeout, as_json, quiet, mlflow, outputs)


def plan(
    measurements: Path | None = typer.Argument(
        None,
        help="JSON file ('-' for stdin) with `measurements` and optionally `targets`. "
        "Optional with --from-mlflow / --from-runs (the runs' tables are added to it).",
    ),
    from_mlflow: str | None = typer.Option(
        None,
        "--from-mlflow",
        metavar="EXPERIMENT",
        help="Build steps_to_target and loss_vs_data from the runs of this MLflow experiment "
        "(name or id): each run's params and eval-loss history. Needs curvplan[mlflow].",
    ),
    run_id: list[str] | None = typer.Option(
        None, "--run-id", help="With --from-mlflow: only this run; repeatable."
    ),
    tracking_uri: str | None = typer.Option(
        None,
        "--tracking-uri",
        help="With --from-mlflow: the tracking server [default: $MLFLOW_TRACKING_URI].",
    ),
    from_runs: Path | None = typer.Option(
        None,
        "--from-runs",
        help="The same from a CSV or JSON-lines export, one row per evaluation: "
        "run, batch_size, examples|tokens, step, loss (other columns are params).",
    ),
    target_loss: float | None = typer.Option(
        None,
        "--target-loss",
        help="With --from-*: the eval loss the steps are counted to (also targets.target_loss) "
        "[default: the measurements file's targets.target_loss].",
    ),
    loss_metric: str | None = typer.Option(
        None,
        "--loss-metric",
        help="With --from-*: the eval-loss metric or column [default: the first of eval_loss, "
        "eval/loss, val_loss, … (a file: loss first)].",
    ),
    param: list[str] | None = typer.Option(
        None,
        "--param",
        help="With --from-*: ROLE=NAME, the run parameter holding a role; repeatable. Roles: "
        "batch_size, per_device_batch_size, devices, gradient_accumulation_steps, examples, "
        "tokens, tokens_per_example, lr (docs/integrations.md lists the defaults).",
    ),
    devices: int | None = typer.Option(
        None,
        "--devices",
        min=1,
        help="With --from-*: devices per run, for a per-device batch size "
        "[default: the run's world_size / n_gpu param].",
    ),
    tokens_per_example: float | None = typer.Option(
        None,
        "--tokens-per-example",
        help="With --from-*: converts dataset sizes given in tokens to examples (and in "
        "examples to tokens, for --target-tokens).",
    ),
    target_tokens: float | None = typer.Option(
        None,
        "--target-tokens",
        help="With --from-*: the tokens the target run will train on (targets.target_tokens): "
        "runs at 2 or more token counts, each a batch sweep, give measurements.batch_sweeps and "
        "budget.batch answers the target run from B_crit(D) = c·D^γ.",
    ),
    name: str | None = typer.Option(None, "--name"),
    tag: list[str] | None = TAG_OPTION,
    wait: bool = typer.Option(False, "--wait", help="Wait for the result, with progress."),
    timeout: float | None = typer.Option(None, "--timeout", min=0),
    idempotency_key: str | None = typer.Option(None, "--idempotency-key"),
    as_json: bool = JSON_OPTION,
    quiet: bool = typer.Option(False, "--quiet", "-q"),
    mlflow: bool = MLFLOW_OPTION,
    outputs: Path | None = OUTPUTS_OPTION,
    webhook_url: str | None = WEBHOOK_OPTION,
    url: str | None = URL_OPTION,
    api_key: str | None = KEY_OPTION,
) -> None:
    """Plan a data budget from measurements you already have (docs/openapi.json), or from
    your own training runs (--from-mlflow, --from-runs; docs/integrations.md)."""
    from curvplan.commands import import_runs as imp
    from curvplan.runs import ParamNames, RunsInputError

    try:
        source = imp.RunSource(
            from_mlflow,
            from_runs,
            list(run_id or []),
            tracking_uri,
            loss_metric,
            ParamNames(_pairs(param, "--param"), devices, tokens_per_example),
        )
    except RunsInputError as exc:
        raise _fail(f"--param: {exc}", EXIT_BAD_INPUT) from None
    problem = imp.check_source(source)
    import_only = {
        "--target-loss": target_loss is not None,
        "--loss-metric": loss_metric is not None,
        "--param": bool(param),
        "--devices": devices is not None,
        "--tokens-per-example": tokens_per_example is not None,
        "--target-tokens": target_tokens is not None,
    }
    if problem is None and not source.given and any(import_only.values()):
        used = [opt for opt, given in import_only.items() if given]
        problem = f"{', '.join(used)}: only with --from-mlflow or --from-runs"
    if problem is not None:
        raise _fail(problem, EXIT_BAD_INPUT)
    if measurements is None and not source.given:
        raise _fail(
            "give a MEASUREMENTS file, --from-mlflow EXPERIMENT or --from-runs FILE",
            EXIT_BAD_INPUT,
        )
    doc: PlanDocument = {"measurements": {}}
    if measurements is not None:
        doc = _read_json(measurements, "MEASUREMENTS")
        if not isinstance(doc, dict) or "measurements" not in doc:
            raise _fail(
                f"{measurements} must be a JSON object with a `measurements` object "
                "(and optionally `targets`, `name`, `tags`)",
                EXIT_BAD_INPUT,
            )
        unknown = sorted(set(doc) - {"measurements", "targets", "name", "tags"})
        if unknown:
            raise _fail(f"{measurements}: unknown top-level keys {unknown}", EXIT_BAD_INPUT)
    runs_report: RunsReport | None = None
    if source.given:
        runs_report = _import_runs(source, doc, target_loss, target_tokens, as_json)
    tags = {**(doc.get("tags") or {}), **_pairs(tag, "--tag")}
    with _client(url, api_key) as client:
        job = client.submit_plan(
            doc["measurements"],
            doc.get("targets"),
            name=name or doc.get("name"),
            tags=tags,
            idempotency_key=idempotency_key,
            webhook_url=webhook_url,
        )
        envelope: RunsEnvelope | None = None if runs_report is None else {"runs": runs_report}
        _finish(client, job, wait, timeout, as_json, quiet, mlflow, outputs, envelope)


def _import_runs(
    source: RunSource,
    doc: PlanDocument,
    target_loss: float | None,
    target_tokens: float | None,
    as_json: bool,
) -> RunsReport:
    """Build the tables from the runs into ``doc``; say which runs were used (stdout, or
    stderr with --json) and fail, submitting nothing, when none is usable or when
    ``--target-tokens`` asks for the batch scaling law and the runs do not give it."""
    from pydantic import ValidationError

    from curvplan.commands import import_runs as imp
    from curvplan.integrations.mlflow import MlflowNotInstalledError
    from curvplan.runs import RunsInputError
    from curvplan.types.planner import Targets

    option = "--from-mlflow" if source.mlflow_experiment is not None else "--from-runs"
    targets = doc.get("targets")
    if target_loss is None and isinstance(targets, dict):
        # the file's Targets.target_loss, passed on as read (the service validates it)
        target_loss = cast("float | None", targets.get("target_loss"))
    file_tokens = targets.get("target_tokens") if isinstance(targets, dict) else None
    law_at = target_tokens
    if target_tokens is not None:
        try:
            Targets(target_tokens=target_tokens)
        except ValidationError as exc:
            message = exc.errors()[0]["msg"]
            raise _fail(f"--target-tokens {target_tokens:g}: {message}", EXIT_BAD_INPUT) from None
    elif isinstance(file_tokens, int | float):
        law_at = float(file_tokens)  # the measurements file's target run
    try:
        result = imp.import_runs(source, target_loss, law_at)
    except MlflowNotInstalledError as exc:
        raise _fail(f"{option}: {exc}", EXIT_BAD_INPUT) from None
    except RunsInputError as exc:
        raise _fail(f"{option}: {exc}", EXIT_BAD_INPUT) from None
    except Exception as exc:  # MLflow's own errors (unreachable server, …)
        raise _fail(f"{option}: reading the runs failed: {exc}", EXIT_SERVICE) from None
    if not result.usable:
        imp.echo_report(result, source, err=True)
        raise _fail(f"{option}: no usable run (see above): nothing submitted", EXIT_BAD_INPUT)
    refusal = None if target_tokens is None else imp.law_refusal(result, doc)
    if refusal is not None:
        imp.echo_report(result, source, err=True)
        raise _fail(f"{option}: {refusal}: nothing submitted", EXIT_BAD_INPUT)
    try:
        imp.merge_into(doc, result, target_loss, target_tokens)
    except RunsInputError as exc:
        raise _fail(f"{option}: {exc}", EXIT_BAD_INPUT) from None
    imp.echo_report(result, source, err=as_json)
    return result.report()


# --------------------------------------------------------------------------- jobs
@jobs_app.command("list")
def jobs_list(
    status: list[str] | None = typer.Option(None, "--status", help="Repeatable or a,b."),
    kind: str | None = typer.Option(None, "--kind", help="plan | analyze"),
    name: str | None = typer.Option(None, "--name"),
    tag: list[str] | None = TAG_OPTION,
    limit: int = typer.Option(20, "--limit", min=1, help="At most this many jobs."),
    as_json: bool = JSON_OPTION,
    url: str | None = URL_OPTION,
    api_key: str | None = KEY_OPTION,
) -> None:
    """The project's jobs, newest first."""
    from curvplan.client import display

    with _client(url, api_key) as client:
        jobs = []
        for job in client.iter_jobs(
            status=status,
            kind=kind,
            name=name,
            tags=_pairs(tag, "--tag"),
            page_size=min(limit, 100),
        ):
            jobs.append(job)
            if len(jobs) >= limit:
                break
        if as_json:
            _print_json([j.model_dump(mode="json") for j in jobs])
        else:
            typer.echo(display.jobs_table(jobs) if jobs else "no jobs")


@jobs_app.command("show")
def jobs_show(
    job_id: str = typer.Argument(..., metavar="JOB", help=JOB_REF_HELP),
    as_json: bool = JSON_OPTION,
    url: str | None = URL_OPTION,
    api_key: str | None = KEY_OPTION,
) -> None:
    """A job: status, progress, error, and its recommendation once it has succeeded."""
    from curvplan.client import display

    with _client(url, api_key) as client:
        job = client.get_job(_job_ref(client, job_id, "JOB"))
        if as_json:
            _print_json(job)
            return
        typer.echo(display.job_summary(job))
        if job.status == "succeeded" and job.result is not None:
            typer.echo("")
            typer.echo(display.recommendation_text(client.get_recommendation(job.id)))


@jobs_app.command("wait")
def jobs_wait(
    job_id: str = typer.Argument(..., metavar="JOB", help=JOB_REF_HELP),
    timeout: float | None = typer.Option(None, "--timeout", min=0),
    as_json: bool = JSON_OPTION,
    quiet: bool = typer.Option(False, "--quiet", "-q"),
    mlflow: bool = MLFLOW_OPTION,
    outputs: Path | None = OUTPUTS_OPTION,
    url: str | None = URL_OPTION,
    api_key: str | None = KEY_OPTION,
) -> None:
    """Wait for a job (progress on stderr); exit 0 if it succeeded, 1 if not."""
    with _client(url, api_key) as client:
        job = client.get_job(_job_ref(client, job_id, "JOB"))
        _finish(client, job, True, timeout, as_json, quiet, mlflow, outputs)


@jobs_app.command("cancel")
def jobs_cancel(
    job_id: str = typer.Argument(..., metavar="JOB", help=JOB_REF_HELP),
    wait: bool = typer.Option(False, "--wait", help="Wait until the job has stopped."),
    as_json: bool = JSON_OPTION,
    url: str | None = URL_OPTION,
    api_key: str | None = KEY_OPTION,
) -> None:
    """Cancel a queued or running job (a finished job cannot be cancelled: exit 2)."""
    with _client(url, api_key) as client:
        job = client.cancel_job(_job_ref(client, job_id, "JOB"))
        if wait:
            job = client.wait(job.id)
        if as_json:
            _print_json(job)
        else:
            typer.echo(f"job {job.id} {job.status}")


# --------------------------------------------------------------------------- recommendations
def recommendations(
    name: str = typer.Argument(..., help="Job name to look up."),
    tag: list[str] | None = TAG_OPTION,
    kind: str | None = typer.Option(None, "--kind", help="plan | analyze"),
    as_json: bool = JSON_OPTION,
    url: str | None = URL_OPTION,
    api_key: str | None = KEY_OPTION,
) -> None:
    """The recommendation of the newest succeeded job named NAME (exit 1 if there is none)."""
    from curvplan.client import display

    with _client(url, api_key) as client:
        entries = client.list_recommendations(
            name, tags=_pairs(tag, "--tag"), kind=kind, page_size=1
        )
        if not entries:
            if as_json:
                _print_json(None)
            raise _fail(f"no succeeded job named {name!r} has a recommendation", EXIT_JOB_FAILED)
        entry = entries[0]
        if as_json:
            _print_json(entry)
            return
        when = entry.finished_at.isoformat() if entry.finished_at else "-"
        typer.echo(f"{entry.name}: {entry.kind} job {entry.job_id}, finished {when}\n")
        typer.echo(display.recommendation_text(entry.recommendation))


# --------------------------------------------------------------------------- report
def report(
    job_id: str = typer.Argument(..., metavar="JOB", help=JOB_REF_HELP),
    open_browser: bool = typer.Option(
        False, "--open", help="Open a short-lived signed link to the report in a browser."
    ),
    out: Path | None = typer.Option(
        None, "--out", help="Write the page, plots (SVG, PNG) and numbers.json here."
    ),
    mlflow: bool = MLFLOW_OPTION,
    as_json: bool = JSON_OPTION,
    url: str | None = URL_OPTION,
    api_key: str | None = KEY_OPTION,
) -> None:
    """A job's report: a short-lived signed link to its page (printed; --open starts a
    browser on it), the page and plots as files (--out), logged to MLflow (--mlflow)."""
    with _client(url, api_key) as client:
        job_id = _job_ref(client, job_id, "JOB")
        if out is not None:
            _write_report_files(client, job_id, out)
        if mlflow:
            _log_to_mlflow(client, job_id, as_json)
        if (out is not None or mlflow) and not open_browser:
            return  # the files or the MLflow run were asked for, not the link
        link = client.report_link(job_id)
        if as_json:
            _print_json(link)
        else:
            typer.echo(f"{link.url}\n(valid until {link.expires_at.isoformat()})")
        if open_browser:
            import webbrowser

            if not webbrowser.open(link.url):
                typer.echo("no browser could be started; open the link above", err=True)


def _write_report_files(client: Client, job_id: str, out: Path) -> None:
    from curvplan.report_files import download_report

    try:
        written = download_report(client, job_id, out)
    except OSError as exc:
        raise _fail(
            f"--out: cannot write to {out}: {exc.strerror or exc}", EXIT_BAD_INPUT
        ) from None
    for path in written:
        typer.echo(str(path))


# --------------------------------------------------------------------------- webhooks
webhooks_app = command_group(
    help="The project's webhook signing secret and a job's deliveries.", no_args_is_help=True
)


@webhooks_app.command("secret")
def webhooks_secret(
    overlap: float | None = typer.Option(
        None,
        "--overlap",
        min=0,
        help="Seconds the old secret keeps signing beside the new one (default: the "
        "service's, 24 h; 0: it stops at once).",
    ),
    as_json: bool = JSON_OPTION,
    url: str | None = URL_OPTION,
    api_key: str | None = KEY_OPTION,
) -> None:
    """Create (or rotate) the project's webhook signing secret and print it (shown once)."""
    with _client(url, api_key) as client:
        made = client.create_webhook_secret(overlap)
        if as_json:
            _print_json(made)
        else:
            typer.echo(made.secret)


@webhooks_app.command("list")
def webhooks_list(
    job_id: str = typer.Argument(..., metavar="JOB"),
    as_json: bool = JSON_OPTION,
    url: str | None = URL_OPTION,
    api_key: str | None = KEY_OPTION,
) -> None:
    """A job's webhook deliveries and each attempt."""
    with _client(url, api_key) as client:
        deliveries = client.list_webhook_deliveries(job_id)
        if as_json:
            _print_json(deliveries)
            return
        for d in deliveries.items:
            typer.echo(f"{d.id}  {d.event_type}  {d.status}  {d.url}")
            for a in d.attempts:
                outcome = a.error or f"HTTP {a.status_code}"
                typer.echo(f"  #{a.number} {a.started_at.isoformat()} {outcome}")


def register(app: typer.Typer) -> None:
    """Attach the client commands to the top-level app."""
    app.command("analyze")(analyze)
    app.command("plan")(plan)
    app.command("sweep")(sweep)
    app.add_typer(jobs_app, name="jobs")
    app.command("recommendations")(recommendations)
    app.command("report")(report)
    app.add_typer(webhooks_app, name="webhooks")


__all__: list[str] = ["register"]
