"""The report's summary names the model an analysis measured (source, architecture, size)."""

from __future__ import annotations

from curvplan_server.reports.page import model_text, render_report


def _job(model: dict, checkpoint: object, measured: dict) -> dict:
    return {
        "id": "j",
        "kind": "analyze",
        "status": "succeeded",
        "request": {"kind": "analyze", "model": model, "checkpoint": checkpoint},
        "result": {"measurements": measured},
    }


def test_hugging_face_model_with_shards_and_a_precision_limit() -> None:
    job = _job(
        {"source": "huggingface", "config": {"model_type": "llama"}},
        ["a", "b", "c"],
        {
            "n_parameters": 1234,
            "model": {
                "architecture": "LlamaForCausalLM",
                "precision_limited": {"limited": True, "reason": "RMSNorm <float32>"},
            },
        },
    )
    text = model_text(job)
    assert text == (
        "Hugging Face llama (LlamaForCausalLM) · 1,234 parameters · checkpoint in 3 shards"
        " · precision limited: RMSNorm <float32>"
    )
    html = render_report(job, plots=[])
    assert "RMSNorm &lt;float32&gt;" in html and "<float32>" not in html


def test_reference_spec_and_plan_jobs() -> None:
    spec = {"d_model": 8, "n_heads": 2, "d_ff": 16, "n_layers": 1, "task": {}}
    text = model_text(_job(spec, "a", {"n_parameters": 99}))
    assert text == "reference Transformer: 1 layers, d_model 8, 2 heads · 99 parameters"
    assert model_text({"kind": "plan", "request": {"kind": "plan"}}) is None


def test_the_cli_job_summary_names_the_model_too() -> None:
    import uuid
    from datetime import UTC, datetime

    from curvplan.client.display import job_summary
    from curvplan.types.jobs import JobOut

    now = datetime.now(UTC)
    job = JobOut.model_validate(
        {
            "id": str(uuid.uuid4()),
            "kind": "analyze",
            "queue": "gpu",
            "status": "queued",
            "name": None,
            "tags": {},
            "progress": None,
            "attempt": 0,
            "max_attempts": 3,
            "cancel_requested": False,
            "result": None,
            "error": None,
            "request": {
                "kind": "analyze",
                "model": {
                    "source": "huggingface",
                    "config": {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]},
                },
                "checkpoint": ["a", "b"],
            },
            "created_at": now,
            "updated_at": now,
            "started_at": None,
            "finished_at": None,
            "links": {"self": "/", "cancel": "/", "recommendation": "/"},
        }
    )
    assert "model      Hugging Face gpt2 (GPT2LMHeadModel) · checkpoint in 2 shards" in job_summary(
        job
    )
