"""The analysis planned at submission, torch-free (``curvplan_core.analysis_plan``), against the
engine: the blocks the API names are the blocks the engine finds (names, order, sizes, pairs),
for the example model and the tiny Hugging Face GPT-2; the bounded basis the memory plan counts
is the spectra's; the fan-out decision and the two admission refusals."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
import torch

from curvplan.types.huggingface import HuggingFaceModel
from curvplan.types.jobs import AnalyzeBlocksJobCreate, AnalyzeJobCreate
from curvplan.types.options import AnalysisOptions
from curvplan.types.spec import ModelSpec
from curvplan_core import analysis_plan, cost_model
from curvplan_core.artifacts.safetensors_format import validate_file

GPT2_SLICES = {
    "q0": ["transformer.h.0.attn.c_attn.weight[:, 0:32]", "transformer.h.0.attn.c_attn.bias[0:32]"],
    "mlp": ["transformer.h.*.mlp.*"],
    "rest": ["transformer.wte.weight", "transformer.ln_f.*"],
}
CASES: dict[str, dict[str, Any]] = {
    "defaults": {},
    "all pairs": {"off_diagonal": True},
    "some blocks": {"blocks": ["layers.1.*", "head", "embed"], "off_diagonal": True},
    "named pairs": {"off_diagonal": [["layers.0.q", "layers.0.k"], ["final_norm", "embed"]]},
}


def _header(path: Path) -> dict[str, Any]:
    """The tensor list the API stores for an uploaded artifact."""
    return validate_file(str(path)).to_json()["tensors"]


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The ``curvplan example`` model's checkpoint and a sample (untrained: sizes only)."""
    from curvplan_worker.curvature.checkpoint import save_checkpoint
    from curvplan_worker.curvature.data import Dataset, save_dataset
    from curvplan_worker.curvature.example import EXAMPLE_SPEC
    from curvplan_worker.curvature.model import build_model

    out = tmp_path_factory.mktemp("plan-example")
    save_checkpoint(build_model(EXAMPLE_SPEC, seed=0), out / "checkpoint.safetensors")
    tokens = torch.randint(0, 16, (4, 33), generator=torch.Generator().manual_seed(0))
    save_dataset(Dataset(tokens[:, :-1], tokens[:, 1:]), out / "data.safetensors")
    return {"model": EXAMPLE_SPEC, "typed": ModelSpec.model_validate(EXAMPLE_SPEC), "dir": out}


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The tiny Hugging Face GPT-2 of ``curvplan example --arch gpt2`` (untrained)."""
    from safetensors.torch import save_file

    from curvplan_worker.curvature.hf import build_hf_model, save_hf_weights
    from curvplan_worker.curvature.hf_example import EXAMPLE_CONFIGS

    out = tmp_path_factory.mktemp("plan-gpt2")
    config = EXAMPLE_CONFIGS["gpt2"]
    save_hf_weights(build_hf_model(config, seed=0), out / "checkpoint.safetensors")
    ids = torch.randint(0, 16, (4, 32), generator=torch.Generator().manual_seed(0))
    save_file({"input_ids": ids, "attention_mask": torch.ones_like(ids)}, out / "data.safetensors")
    model = {"source": "huggingface", "config": config}
    return {"model": model, "typed": HuggingFaceModel.model_validate(model), "dir": out}


def _both(problem: dict[str, Any], options: dict[str, Any]) -> tuple[Any, Any]:
    from curvplan_worker.curvature.analyze import plan_blocks

    ckpt, data = problem["dir"] / "checkpoint.safetensors", problem["dir"] / "data.safetensors"
    engine = plan_blocks(problem["model"], str(ckpt), str(data), options)
    shapes = analysis_plan.parameter_shapes(problem["typed"], [_header(ckpt)])
    assert shapes is not None
    free = analysis_plan.plan_blocks(problem["typed"], shapes, AnalysisOptions(**options))
    return engine, free


@pytest.mark.parametrize("case", sorted(CASES))
def test_torch_free_blocks_equal_the_engines_for_the_example_model(example, case) -> None:
    engine, free = _both(example, CASES[case])
    assert list(free.blocks.items()) == list(engine.blocks.items())  # names, order and sizes
    assert free.pairs == engine.pairs
    assert len(free.blocks) > 1


@pytest.mark.parametrize("case", [*sorted(CASES), "slices"])
def test_torch_free_blocks_equal_the_engines_for_the_tiny_hf_gpt2(gpt2, case) -> None:
    options = {"block_definitions": GPT2_SLICES} if case == "slices" else CASES[case]
    engine, free = _both(gpt2, options)
    assert list(free.blocks.items()) == list(engine.blocks.items())
    assert free.pairs == engine.pairs
    if case == "defaults":  # the fused c_attn is split into q, k, v column slices
        assert free.blocks["layers.0.q"] == 32 * 32 + 32


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_hf_parameter_shapes_from_the_config_are_the_modules(arch: str) -> None:
    from curvplan.types.huggingface import parameter_count
    from curvplan_worker.curvature.hf import build_hf_model
    from curvplan_worker.curvature.hf_example import EXAMPLE_CONFIGS

    config = EXAMPLE_CONFIGS[arch]
    module = build_hf_model(config, seed=0).module
    want = {name: tuple(p.shape) for name, p in module.named_parameters()}
    got = analysis_plan.hf_parameter_shapes(config)
    assert got == want
    assert sum(torch.Size(s).numel() for s in got.values()) == parameter_count(config)


def test_the_spectra_size_their_basis_by_the_cost_models_rule() -> None:
    """One rule for the plan and the engine: the Lanczos a block runs holds exactly the
    vectors the memory plan priced."""
    from curvplan_worker.curvature import spectra

    for n in (5, 64, 2_112, 40_000):
        want = cost_model.basis_vectors(n, None, 4, 2)
        spec = spectra.lanczos_spectrum(
            lambda v: v * 2.0,
            n,
            generator=torch.Generator().manual_seed(0),
            tol=1e-3,
            max_iter=3,
            dtype=torch.float32,
        )
        assert spec.basis_vectors == want
    # GPT-2 small's embed block (38.6 M) in a 2 GiB budget: about 12 float32 vectors
    assert cost_model.basis_vectors(38_600_000, 2 * 1024**3, 4) == 13


def test_a_small_operator_keeps_up_to_16_mib_of_basis_a_large_one_32_vectors() -> None:
    mib = 1024**2
    for n in (64, 528, 2_112, 16_640, 65_536, 131_072, 1_000_000):
        vectors = cost_model.basis_vectors(n, None, 4, 2)
        if n * 4 * 33 <= 16 * mib:  # more than 32 fit in 16 MiB: the small-operator rule
            assert vectors == min(n + 1, 320, 16 * mib // (n * 4))
        else:
            assert vectors == 32
    # the small-operator allowance never exceeds the caller's budget
    assert cost_model.basis_vectors(2_112, 2_112 * 4 * 10, 4, 2) == 10
    assert cost_model.basis_vectors(2_112, 2_112 * 4 * 100, 4, 2) == 100


def test_the_whole_model_basis_limit_is_the_engines() -> None:
    from curvplan_worker.curvature import full_model

    assert cost_model.FULL_MODEL_BASIS_BYTES == full_model.FULL_BASIS_BYTES


def test_the_memory_plan_counts_the_bounded_basis_whatever_max_iter() -> None:
    from curvplan_worker.curvature.limits import largest_basis_bytes

    sizes = {"ffn_in": 262_144, "ln": 256}
    short = largest_basis_bytes(sizes, AnalysisOptions(max_iter=50), 10**6)
    long = largest_basis_bytes(sizes, AnalysisOptions(max_iter=10_000), 10**6)
    assert short == long == 32 * 262_144 * 4 + 2 * 262_144 * 8  # not 10k float64 vectors
    strict = largest_basis_bytes(sizes, AnalysisOptions(precision="float64"), 10**6)
    assert strict == 32 * 262_144 * 8 + 2 * 262_144 * 8
    small = largest_basis_bytes(sizes, AnalysisOptions(), 10**6, budget=2**20)
    assert small == 6 * 262_144 * 4 + 2 * 262_144 * 8  # ⌊1 MiB / 1 MiB⌋ = 1 → the floor of 6


def test_restarts_lift_the_step_cap_above_the_block_size() -> None:
    opts = cost_model.CostOptions(max_iter=300)
    assert cost_model.step_cap(10, opts) == 10  # the whole Krylov space fits: n steps at most
    assert cost_model.step_cap(100, opts) == 100  # so does a small operator's (16 MiB)
    big = 1_000_000  # 32 vectors: a restarted basis can take max_iter steps
    assert cost_model.step_cap(big, opts) == 300
    assert cost_model.block_products(big, opts)[1] == 300


# --------------------------------------------------------------------------- the decision
SHAPES = {"embed.weight": (16, 32), "layers.0.ffn_in.weight": (64, 32), "head.weight": (16, 32)}
SAMPLE = analysis_plan.Sample(n_examples=64, tokens=64 * 32.0)
SPEC = ModelSpec.model_validate(
    {
        "d_model": 32,
        "n_heads": 2,
        "d_ff": 64,
        "n_layers": 1,
        "task": {"type": "causal_lm", "vocab_size": 16, "seq_len": 32},
    }
)


def _limits(**kw: Any) -> analysis_plan.Limits:
    values: dict[str, Any] = {"live_workers": 2, "time_limits": {"analyze": 86400.0}}
    return analysis_plan.Limits(**{**values, **kw})


def test_a_short_analysis_runs_in_one_process_unless_fan_out_forces_it() -> None:
    plan = analysis_plan.plan_analysis(SPEC, AnalysisOptions(), SHAPES, SAMPLE, _limits())
    assert not plan.fans_out and "threshold" in plan.reason
    forced = analysis_plan.plan_analysis(
        SPEC, AnalysisOptions(fan_out=True), SHAPES, SAMPLE, _limits(live_workers=0)
    )
    assert forced.fans_out and len(forced.groups) == 2
    assert sorted(b for g in forced.groups for b in g.blocks) == [
        "embed",
        "head",
        "layers.0.ffn_in",
    ]
    assert all(g.cost > 0 for g in forced.groups)


def test_a_long_analysis_fans_out_only_with_two_live_workers() -> None:
    options = AnalysisOptions(trace_probes=2000)  # seconds of spectra at the prior
    two = analysis_plan.plan_analysis(
        SPEC, options, SHAPES, SAMPLE, _limits(fan_out_min_seconds=0.01)
    )
    assert two.fans_out, two.reason
    # groups are balanced by the cost model's seconds of each block
    spectra = two.estimate.stage("blocks")
    assert spectra is not None
    assert sum(g.cost for g in two.groups) == pytest.approx(spectra.seconds)
    one = analysis_plan.plan_analysis(
        SPEC, options, SHAPES, SAMPLE, _limits(fan_out_min_seconds=0.01, live_workers=1)
    )
    assert not one.fans_out and "1 gpu worker slot" in one.reason
    never = analysis_plan.plan_analysis(
        SPEC, options.model_copy(update={"fan_out": False}), SHAPES, SAMPLE, _limits()
    )
    assert not never.fans_out


def test_over_time_limit_names_the_estimate_and_the_options() -> None:
    plan = analysis_plan.plan_analysis(
        SPEC,
        AnalysisOptions(trace_probes=5000),
        SHAPES,
        SAMPLE,
        _limits(time_limits={"analyze": 1}),
    )
    [refusal] = plan.refusals
    assert refusal.type == "over-time-limit" and refusal.field == ("options",)
    assert f"estimated at {plan.estimate.seconds:.0f} s" in refusal.message
    assert "products ×" in refusal.message and "1 s limit" in refusal.message
    for option in ("max_iter", "tolerance", "blocks", "trace_probes"):
        assert option in refusal.message


def test_too_large_names_the_memory_and_the_options() -> None:
    plan = analysis_plan.plan_analysis(
        SPEC, AnalysisOptions(), SHAPES, SAMPLE, _limits(memory_limit_bytes=10_000)
    )
    [refusal] = plan.refusals
    assert refusal.type == "too-large"
    n = sum(torch.Size(s).numel() for s in SHAPES.values())
    assert plan.memory_bytes == 4 * n * 4 + cost_model.largest_basis_bytes(
        {"embed": 512, "layers.0.ffn_in": 2048, "head": 512}, AnalysisOptions(), n
    )
    assert "Lanczos basis" in refusal.message and "blocks" in refusal.message


def test_the_children_carry_the_parents_validated_request_unparsed() -> None:
    body = AnalyzeJobCreate(
        kind="analyze",
        model=SPEC,
        checkpoint=[uuid.uuid4(), uuid.uuid4()],
        dataset=uuid.uuid4(),
        options=AnalysisOptions(fan_out=True, off_diagonal=[["embed", "head"]], seed=5),
        resources={"devices": 2},
    )
    plan = analysis_plan.plan_analysis(
        body.model, body.options, SHAPES, SAMPLE, _limits(live_workers=0)
    )
    children = analysis_plan.child_requests(body, plan)
    assert len(children) == len(plan.groups) == 2
    for child, group in zip(children, plan.groups, strict=True):
        request = child.request
        # the parent's model and options objects themselves: nothing parsed again
        assert request.model is body.model and request.options is body.options
        assert request.checkpoint == body.checkpoint and request.dataset == body.dataset
        assert request.resources.devices == 2
        assert request.blocks == group.blocks and request.estimated_cost == group.cost
        stored = child.stored()
        assert stored["kind"] == "analyze_blocks" and stored["eta_seconds"] == group.cost
        assert stored["name"].startswith(f"blocks {children.index(child) + 1}/2")
        # what the row stores parses back into the same create model
        assert AnalyzeBlocksJobCreate.model_validate(stored["request"]) == request
    assert sorted(b for c in children for b in c.request.blocks) == sorted(plan.blocks.blocks)
    assert [p for c in children for p in c.request.pairs] == [("embed", "head")]
