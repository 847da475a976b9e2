"""Hugging Face models end to end: save_pretrained directories → client/CLI → real API, worker
and PostgreSQL → recommendation and report under the uniform block names."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from analyze_files import TARGETS
from live_plugin import LiveService
from tiny_hf_models import (
    GPT2_CONFIG,
    HF_OPTIONS,
    LLAMA_CONFIG,
    N_EXAMPLES,
    save_tiny,
    write_hf_datasets,
)

import curvplan
from curvplan.client import ValidationFailedError
from curvplan.client.pretrained import read_pretrained

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]
pytest.importorskip("transformers")

SUBLAYERS = ("ln1", "q", "k", "v", "o", "ln2", "ffn_in", "ffn_out")
LAYER0 = [f"layers.0.{s}" for s in SUBLAYERS]


@pytest.fixture(scope="module")
def hf_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("hf-e2e")
    files = write_hf_datasets(out)
    files["gpt2"] = save_tiny(GPT2_CONFIG, out / "gpt2", max_shard_size="2KB")
    files["gpt2-wide"] = save_tiny({**GPT2_CONFIG, "n_embd": 12}, out / "gpt2-wide")
    files["llama"] = save_tiny(LLAMA_CONFIG, out / "llama")
    (out / "targets.json").write_text(json.dumps(TARGETS))
    files["targets"] = out / "targets.json"
    return files


def _section(html: str, plot_id: str) -> str:
    start = html.index(f'id="section-{plot_id}"')
    return html[start : html.index("</section>", start)]


def _check_report(api: curvplan.Client, job: Any, names: list[str], model: str) -> None:
    """The recommendation and the report page show the blocks under the uniform names."""
    from curvplan_server.reports.plots import block_heatmap_plot
    from curvplan_server.reports.view import ReportJob

    rec = api.get_recommendation(job.id)
    assert rec.curvature is not None and rec.curvature.status == "computed"
    assert [b.name for b in rec.curvature.blocks] == names
    report_job = ReportJob.of(job.model_dump(mode="json"))
    typed, why = report_job.recommendation()
    assert typed is not None, why
    heatmap = block_heatmap_plot(report_job, typed)
    assert heatmap.svg is not None, heatmap.empty_reason
    assert heatmap.numbers["layers"] == [0] and heatmap.numbers["sublayers"] == list(SUBLAYERS)
    assert all(v is not None and v >= 0 for v in heatmap.numbers["spectral_norm"][0])
    html = api.get_report_html(job.id)
    section = _section(html, "block-norms")
    assert "<svg" in section and "Empty:" not in section
    assert model in html


def test_sharded_gpt2_directory_through_the_service_matches_the_engine(
    live: LiveService, hf_files: dict[str, Path]
) -> None:
    from curvplan.types.options import MachineSettings
    from curvplan_worker.curvature.analyze import analyze

    pretrained = read_pretrained(hf_files["gpt2"])
    assert len(pretrained.shards) > 1
    uploads: list[Path] = []
    with curvplan.Client(live.url, live.api_key) as api:
        job = api.submit_analyze(
            hf_files["gpt2"],
            dataset=hf_files["masked"],
            name="hf-gpt2",
            options=HF_OPTIONS,
            targets=TARGETS,
            on_upload=uploads.append,
        )
        assert uploads == [*pretrained.shards, hf_files["masked"]]
        assert job.request is not None
        assert job.request["model"] == {"source": "huggingface", "config": pretrained.config}
        assert len(job.request["checkpoint"]) == len(pretrained.shards)
        done = api.wait(job.id, timeout=240)
        assert done.status == "succeeded", (done.error, live.logs())

        measured = done.model_dump(mode="json")["result"]["measurements"]
        blocks = {b["name"]: b for b in measured["blocks"]}
        names = ["embed", *LAYER0, "final_norm"]  # tied embeddings: no head block
        assert list(blocks) == names
        assert blocks["layers.0.k"]["params"] == [
            "transformer.h.0.attn.c_attn.weight[:, 8:16]",
            "transformer.h.0.attn.c_attn.bias[8:16]",
        ]
        assert blocks["embed"]["params"] == ["transformer.wte.weight", "transformer.wpe.weight"]
        assert measured["per_sample"]["losses"]["shape"] == [N_EXAMPLES]

        # The worker measured the uploaded shards as the engine measures the local directory.
        direct = analyze(
            pretrained.model,
            [str(p) for p in pretrained.shards],
            str(hf_files["masked"]),
            {**HF_OPTIONS, "per_sample": False, "bounds": False},
            machine=MachineSettings(self_test=False),  # as the live worker runs
        )
        for block in direct["blocks"]:
            got = blocks[block["name"]]
            for key in ("lambda_max", "lambda_min"):
                assert got[key] == pytest.approx(block[key], rel=1e-6, abs=1e-12), block["name"]
        _check_report(api, done, names, "Hugging Face gpt2 (GPT2LMHeadModel)")


def test_llama_directory_with_the_cli(live: LiveService, hf_files: dict[str, Path]) -> None:
    flags = []
    for key, value in HF_OPTIONS.items():
        flags += ["--option", f"{key}={json.dumps(value)}"]
    args = ["analyze", "--model", str(hf_files["llama"]), "--data", str(hf_files["labelled"])]
    args += ["--targets", str(hf_files["targets"]), "--name", "hf-llama", "--wait", "--json"]
    run = subprocess.run(
        [sys.executable, "-m", "curvplan.cli", *args, "--timeout", "240", *flags],
        env=live.client_env(),
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-2000:], live.logs())
    job = json.loads(run.stdout)
    assert job["status"] == "succeeded"
    measured = job["result"]["measurements"]
    names = ["embed", *LAYER0, "final_norm", "head"]  # untied lm_head
    assert [b["name"] for b in measured["blocks"]] == names
    blocks = {b["name"]: b for b in measured["blocks"]}
    assert blocks["layers.0.ffn_in"]["params"] == [
        "model.layers.0.mlp.gate_proj.weight",
        "model.layers.0.mlp.up_proj.weight",
    ]
    assert blocks["head"]["params"] == ["lm_head.weight"]
    # RMSNorm and rotary embeddings compute in float32 inside the model: said, not hidden.
    assert measured["model"]["precision_limited"]["limited"] is True
    with curvplan.Client(live.url, live.api_key) as api:
        typed = api.get_job(job["id"])
        _check_report(api, typed, names, "Hugging Face llama (LlamaForCausalLM)")
    from curvplan.client.display import job_summary  # what `curvplan jobs show` prints

    n_parameters = measured["n_parameters"]
    assert (
        f"model      Hugging Face llama (LlamaForCausalLM) · {n_parameters:,} parameters"
        " · precision limited: " in job_summary(typed)
    )


def test_shard_mismatch_fails_the_job_naming_every_tensor(
    live: LiveService, hf_files: dict[str, Path]
) -> None:
    pretrained = read_pretrained(hf_files["gpt2"])
    index = json.loads((hf_files["gpt2"] / "model.safetensors.index.json").read_text())
    dropped = pretrained.shards[-1]
    lost = sorted(t for t, f in index["weight_map"].items() if f == dropped.name)
    wide = read_pretrained(hf_files["gpt2-wide"])

    async def scenario() -> tuple[Any, Any]:
        async with curvplan.AsyncClient(live.url, live.api_key) as api:
            missing = await api.submit_analyze(
                pretrained.model,
                list(pretrained.shards[:-1]),
                hf_files["masked"],
                options=HF_OPTIONS,
            )
            shaped = await api.submit_analyze(
                pretrained.model, wide.shards[0], hf_files["masked"], options=HF_OPTIONS
            )
            return await api.wait(missing.id, timeout=120), await api.wait(shaped.id, timeout=120)

    missing, shaped = asyncio.run(scenario())
    assert missing.status == "failed", live.logs()
    assert missing.error.type == "checkpoint-mismatch"
    for tensor in lost:  # every tensor of the shard left out, named
        assert tensor.removeprefix("transformer.") in missing.error.detail, tensor
    assert shaped.status == "failed" and shaped.error.type == "checkpoint-mismatch"
    assert "wte.weight" in shaped.error.detail
    assert "(13, 8)" in shaped.error.detail and "(13, 12)" in shaped.error.detail
    assert "Traceback" not in shaped.error.detail


def test_refused_configs_are_422_before_anything_is_queued(
    live: LiveService, hf_files: dict[str, Path]
) -> None:
    name = f"refused-{uuid.uuid4().hex[:8]}"
    llama_70b = {  # above the default limit of 2e9 parameters; no weights needed to refuse it
        "model_type": "llama",
        "vocab_size": 128256,
        "hidden_size": 8192,
        "intermediate_size": 28672,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
    }
    cases = [
        (
            {**GPT2_CONFIG, "auto_map": {"AutoModelForCausalLM": "m.M"}},
            "body.model.config.auto_map",
        ),
        ({"model_type": "t5", "vocab_size": 13}, "body.model.config.model_type"),
        (llama_70b, "body.model.config"),
    ]
    with curvplan.Client(live.url, live.api_key) as api:
        shard = api.upload_artifact(read_pretrained(hf_files["gpt2"]).shards[0], "checkpoint")
        data = api.upload_artifact(hf_files["masked"], "dataset")
        messages = []
        for config, field in cases:
            model = {"source": "huggingface", "config": config}
            with pytest.raises(ValidationFailedError) as info:
                api.submit_analyze(model, shard, data, name=name)
            [error] = info.value.errors
            assert error["field"] == field
            messages.append(error["message"])
        assert "remote code" in messages[0]
        assert "'t5'" in messages[1] and "GPT2LMHeadModel" in messages[1]
        assert "LlamaForCausalLM" in messages[1]
        assert "parameters" in messages[2] and "2,000,000,000" in messages[2]
        assert api.list_jobs(name=name).items == []
