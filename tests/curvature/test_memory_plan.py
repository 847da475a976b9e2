"""Memory planning and the out-of-memory retry of the curvature engine, on the CPU
(docs/numerics.md#memory-plan, #oom-retry).

The oracle of every numeric check is the same analysis without a budget and without
out-of-memory errors: micro-batching never changes the loss (each batch is divided by the total
count), so the spectra agree to summation order (1e-12 in float64).
"""

from __future__ import annotations

import pytest
import torch
from _engine_cases import TINY_CLASSIFIER_SPEC
from pydantic import ValidationError

from curvplan.types.options import MachineSettings, parse_byte_size, parse_options
from curvplan.types.spec import parse_spec
from curvplan_worker.curvature.analyze import analyze
from curvplan_worker.curvature.checkpoint import save_checkpoint
from curvplan_worker.curvature.data import Dataset, save_dataset
from curvplan_worker.curvature.memory import (
    OutOfDeviceMemory,
    ProductMemory,
    choose,
)
from curvplan_worker.curvature.memory_fit import measure_product
from curvplan_worker.curvature.model import build_model
from curvplan_worker.curvature.objective import objective_for
from curvplan_worker.curvature.operator import CurvatureEngine

pytestmark = pytest.mark.usefixtures("single_thread")

SPEC = TINY_CLASSIFIER_SPEC
N = 10
OPTIONS = {
    "precision": "float64",
    "blocks": ["layers.0.q", "layers.0.ffn_in", "head"],
    "trace_probes": 4,
    "dense": "off",
    "per_sample": False,
    "gradient_noise": False,
    "bounds": False,
}


class InjectedOutOfMemory(torch.cuda.OutOfMemoryError):
    """What a CUDA allocation failure raises, injected on the CPU."""


def _model():
    model = build_model(SPEC, seed=0, dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.4 * torch.randn(p.shape, generator=gen, dtype=torch.float64))
    return model


def _data() -> Dataset:
    gen = torch.Generator().manual_seed(1)
    return Dataset(
        torch.randn(N, 3, 2, generator=gen, dtype=torch.float64),
        torch.randint(0, 3, (N,), generator=gen),
    )


def _analyze(machine: MachineSettings, **options) -> dict:
    return analyze(
        SPEC,
        None,
        None,
        {**OPTIONS, **options},
        machine=machine,
        model=_model(),
        data=_data(),
    )


def _numbers(result: dict) -> list[float]:
    out = [result["loss"], result["gradient_norm"]]
    for block in result["blocks"]:
        out += [block["lambda_max"], block["lambda_min"], block["trace"]["value"]]
    return out


@pytest.fixture(scope="module")
def unplanned() -> dict:
    """The whole sample in one cached batch, no budget: the oracle."""
    return _analyze(MachineSettings(self_test=False, device="cpu"))


def _assert_same_numbers(result: dict, oracle: dict) -> None:
    got, want = _numbers(result), _numbers(oracle)
    assert got == pytest.approx(want, rel=1e-12, abs=1e-14)


def test_choose_takes_the_largest_micro_batch_that_fits_cached_then_uncached():
    m = ProductMemory(probe_examples=2, saved_bytes=200, gradient_bytes=50, cuda_peak_bytes=None)
    # a = 100 per example, g = 50, f = 2: uncached(m) = 2(100m + 50);
    # cached(m) = 100N + ⌈N/m⌉·50 + (100m + 50)
    assert choose(m, 10, 10, True, None) == (10, True, 1000 + 50 + 1050)
    assert choose(m, 10, 10, True, 2100) == (10, True, 2100)
    # m = 9: 1000 + 100 + 950 = 2050 > 2000; m = 8: 1000 + 100 + 850 = 1950
    assert choose(m, 10, 10, True, 2000) == (8, True, 1950)
    # cached needs ≥ 1500 at any m; uncached: 2·650 = 1300 ≤ 1400 < 2·750
    assert choose(m, 10, 10, True, 1400) == (6, False, 1300)
    assert choose(m, 10, 4, False, 10**9)[:2] == (4, False)  # never above the configured size
    with pytest.raises(OutOfDeviceMemory, match=r"one example does not fit in the budget of"):
        choose(m, 10, 10, True, 299)  # 2·(100 + 50) = 300
    cuda = ProductMemory(2, 200, 50, cuda_peak_bytes=750)
    assert cuda.factor == pytest.approx(3.0) and cuda.source == "cuda-peak"


def test_measured_graph_memory_is_linear_in_the_examples_and_excludes_the_weights():
    model, data = _model(), _data()
    objective = objective_for(SPEC)
    with CurvatureEngine(model, objective, data.batches(None)) as engine:
        one, two = measure_product(engine, 1), measure_product(engine, 2)
        n_hvp = engine.n_hvp
    assert n_hvp == 0  # the measurement is not one of the analysis' products
    weights = sum(p.numel() * 8 for p in model.parameters())
    assert one.gradient_bytes == weights == two.gradient_bytes
    # activations per example: the second example adds what the first holds (up to scalars)
    assert two.saved_bytes - one.saved_bytes == pytest.approx(one.saved_bytes, rel=0.01)
    # the logits alone are saved for the softmax backward: at least 3 classes × 8 bytes
    assert one.per_example_bytes >= 3 * 8


def test_a_small_budget_plans_a_smaller_uncached_micro_batch_with_the_same_results(unplanned):
    probe = unplanned["memory_plan"]
    assert probe["budget_bytes"] is None and probe["micro_batch"] == N and probe["cache_graph"]
    assert probe["source"] == "saved-tensors"
    per_example, gradient = probe["per_example_bytes"], probe["gradient_bytes"]
    budget = int(2 * (3 * per_example + gradient)) + 1  # uncached micro-batch 3 fits, 4 not
    result = _analyze(MachineSettings(self_test=False, device="cpu", memory_budget=budget))
    plan = result["memory_plan"]
    assert (plan["micro_batch"], plan["cache_graph"], plan["budget_bytes"]) == (3, False, budget)
    assert plan["predicted_peak_bytes"] <= budget and plan["retries"] == []
    assert result["n_eval_batches"] == 4 and result["cache_graph"] is False
    assert result["eval_batch_size"] == 3
    assert result["peak_memory_bytes"] > 0 and result["peak_memory_source"] == "process-max-rss"
    _assert_same_numbers(result, unplanned)


def test_injected_out_of_memory_halves_the_micro_batch_and_redoes_the_product(
    monkeypatch, unplanned
):
    real = CurvatureEngine.batch_loss
    calls = {"n": 0}

    def failing(self, index, params=None):
        calls["n"] += 1
        # gradient: calls 1-3 (batches 4, 4, 2); first product: fails in its second batch
        # (after the first one was cached and summed), then again on its first retry batch
        if calls["n"] in (5, 6):
            raise InjectedOutOfMemory("CUDA out of memory (injected)")
        return real(self, index, params)

    monkeypatch.setattr(CurvatureEngine, "batch_loss", failing)
    result = _analyze(MachineSettings(self_test=False, device="cpu"), eval_batch_size=4)
    plan = result["memory_plan"]
    assert plan["micro_batch"] == 4 and plan["cache_graph"] is True
    assert [(r["from_micro_batch"], r["to_micro_batch"]) for r in plan["retries"]] == [
        (4, 2),
        (2, 1),
    ]
    assert plan["final_micro_batch"] == 1
    _assert_same_numbers(result, unplanned)


def test_out_of_memory_at_micro_batch_one_is_a_named_job_error(monkeypatch, tmp_path):
    from curvplan_worker.analyze.pipeline import measure_engine
    from curvplan_worker.errors import JobError
    from curvplan_worker.job_context import JobContext

    save_checkpoint(_model(), tmp_path / "ckpt.safetensors")
    save_dataset(_data(), tmp_path / "data.safetensors")

    def always(self, index, params=None):
        raise InjectedOutOfMemory("CUDA out of memory (injected)")

    monkeypatch.setattr(CurvatureEngine, "batch_loss", always)
    ctx = JobContext(
        job_id="j",
        attempt=1,
        data_dir=tmp_path,
        send_progress=lambda *a: None,
        is_cancelled=lambda: False,
    )
    with pytest.raises(JobError) as err:
        measure_engine(  # the job's typed spec and options, as the analyze pipeline passes them
            parse_spec(SPEC),
            str(tmp_path / "ckpt.safetensors"),
            str(tmp_path / "data.safetensors"),
            parse_options(OPTIONS),
            MachineSettings(self_test=False, device="cpu", memory_budget="1GiB"),
            ctx,
        )
    error = err.value.as_dict()
    assert error["type"] == "out-of-memory"
    assert "one example does not fit in the budget of 1.00 GiB" in error["detail"]
    assert "measured: saved-tensors" in error["detail"] and "gradient" in error["detail"]


def test_memory_budget_is_a_worker_setting_in_bytes_or_units():
    assert parse_byte_size("8GiB") == 8 * 2**30
    assert parse_byte_size("512 MiB") == 512 * 2**20
    assert parse_byte_size("1.5GB") == 1_500_000_000
    assert parse_byte_size(4096) == parse_byte_size("4096") == 4096
    assert parse_byte_size(None) is None and parse_byte_size(" ") is None
    assert MachineSettings(memory_budget="8GiB").memory_budget == 8 * 2**30
    for bad in ("eight", "8 parsecs", "-1GiB", "0", True):
        with pytest.raises(ValidationError, match="memory_budget"):
            MachineSettings(memory_budget=bad)
    with pytest.raises(ValueError, match="memory_budget is a worker setting"):
        parse_options({"memory_budget": "8GiB"})


def test_worker_settings_read_the_budget_from_the_environment(monkeypatch):
    from curvplan_core.config import Settings

    monkeypatch.setenv("CURVPLAN_WORKER_MEMORY_BUDGET", "2GiB")
    assert Settings().machine_settings().memory_budget == 2 * 2**30
    monkeypatch.setenv("CURVPLAN_WORKER_MEMORY_BUDGET", "2 gallons")
    with pytest.raises(ValidationError, match="CURVPLAN_WORKER_MEMORY_BUDGET"):
        Settings()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_plan_uses_the_measured_peak_and_the_free_memory(unplanned):
    result = _analyze(MachineSettings(self_test=False, device="cuda"))
    plan = result["memory_plan"]
    assert plan["source"] == "cuda-peak" and plan["cuda_peak_bytes_probe"] > 0
    assert plan["product_factor"] >= 1.0 and plan["budget_source"].startswith("free CUDA")
    assert result["peak_memory_source"] == "cuda-max-allocated"
    assert result["peak_memory_bytes"] >= plan["cuda_peak_bytes_probe"]
    got, want = _numbers(result), _numbers(unplanned)
    assert got == pytest.approx(want, rel=1e-10, abs=1e-13)  # another device's summation order
