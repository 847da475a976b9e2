"""Per-block generators: a block's (and a pair's) numbers do not depend on which blocks were
measured before it, so a block fan-out assembles the single-process result.

"Equal" is to the rounding of a batched product: the lockstep spectra batch the running
blocks' products into one second backward, and a batch of four vectors rounds differently
from a batch of one (float32: ~3e-8 relative on λ, and rounding-level quantities such as a
residual differ by far more). The runs are in float64, where that rounding is ~1e-15, so
the 1e-8 comparison of ``assert_records_close`` still catches any change of a block's random
stream (a different seed moves the trace estimate at the 1e-2 level)."""

from __future__ import annotations

import hashlib

import pytest
import torch
from _engine_cases import TINY_CLASSIFIER_SPEC
from record_compare import assert_records_close

from curvplan.types.options import MachineSettings
from curvplan_worker.curvature.analyze import (
    BlockShare,
    MeasuredBlocks,
    analyze,
    derived_seed,
    plan_blocks,
)
from curvplan_worker.curvature.data import Dataset
from curvplan_worker.curvature.model import build_model

pytestmark = pytest.mark.usefixtures("single_thread")

SPEC = TINY_CLASSIFIER_SPEC
OPTIONS = {
    "precision": "float64",
    "blocks": ["layers.0.q", "layers.0.k", "layers.0.v", "head"],
    "off_diagonal": [["layers.0.q", "layers.0.k"], ["layers.0.v", "head"]],
    "trace_probes": 6,
    "max_iter": 12,
    "dense": "off",
    "per_sample": False,
    "gradient_noise": False,
    "bounds": False,
    "seed": 7,
}
MACHINE = MachineSettings(threads=1, self_test=False)


def _model() -> torch.nn.Module:
    model = build_model(SPEC, seed=3)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.4 * torch.randn(p.shape, generator=gen))
    return model


def _data() -> Dataset:
    gen = torch.Generator().manual_seed(4)
    return Dataset(torch.randn(8, 3, 2, generator=gen), torch.randint(0, 3, (8,), generator=gen))


# The GGN and functional parts draw from the block's generator too (after its trace probes);
# their products are costly, so a cheaper setting on two small blocks covers them.
GGN_OPTIONS = {
    **OPTIONS,
    "blocks": ["layers.0.ln1", "layers.0.ln2"],
    "off_diagonal": False,
    "ggn": True,
    "max_iter": 4,
    "trace_probes": 2,
}


def _run(options: dict = OPTIONS, **kwargs) -> dict:
    return analyze(
        SPEC, None, None, options, machine=MACHINE, model=_model(), data=_data(), **kwargs
    )


def _by_name(records: list[dict]) -> dict[str, dict]:
    return {r["name"]: r for r in records}


def test_the_derived_seed_is_the_documented_sha256_prefix():
    digest = hashlib.sha256(b"7:block:head").digest()
    assert derived_seed(7, "block:head") == int.from_bytes(digest[:8], "big")
    assert derived_seed(7, "block:head") != derived_seed(8, "block:head")
    assert derived_seed(7, "block:head") != derived_seed(7, "block:embed")


@pytest.mark.slow
@pytest.mark.parametrize("options", [OPTIONS, GGN_OPTIONS], ids=["spectra-trace", "ggn"])
def test_a_block_alone_equals_the_same_block_measured_after_others(options):
    blocks = list(plan_blocks(SPEC, None, None, options, model=_model(), data=_data()).blocks)
    target, before = blocks[-1], blocks[:-1]
    alone = _run(options, only=BlockShare(blocks=(target,)))
    after = _run(options, only=BlockShare(blocks=(*before, target)))
    assert [r["name"] for r in alone["blocks"]] == [target]
    a = _by_name(alone["blocks"])[target]
    assert_records_close(a, _by_name(after["blocks"])[target], target)
    assert "trace" in a and ("ggn" in a) == options.get("ggn", False)
    assert alone["seed_derivation"]["scheme"] == "sha256"


def test_a_pair_alone_equals_the_pair_measured_after_another():
    first, second = (tuple(p) for p in OPTIONS["off_diagonal"])
    alone = _run(only=BlockShare(pairs=(second,)))
    after = _run(only=BlockShare(pairs=(first, second)))
    assert_records_close(alone["off_diagonal"], [after["off_diagonal"][1]], "off_diagonal")
    assert alone["blocks"] == []


def test_split_records_plugged_into_the_fan_in_equal_the_single_process_result():
    plan = plan_blocks(SPEC, None, None, OPTIONS, model=_model(), data=_data())
    names = list(plan.blocks)
    pairs = [(r, c) for r, c, _, _ in plan.pairs]
    # two shares in reverse order, as two children on two workers would measure them
    one = _run(only=BlockShare(blocks=tuple(names[::2][::-1]), pairs=tuple(pairs[1:])))
    two = _run(only=BlockShare(blocks=tuple(names[1::2][::-1]), pairs=tuple(pairs[:1])))
    measured = MeasuredBlocks.from_json(
        blocks=one["blocks"] + two["blocks"], off_diagonal=one["off_diagonal"] + two["off_diagonal"]
    )
    assembled = _run(measured=measured)
    single = _run()
    assert_records_close(assembled["blocks"], single["blocks"], "blocks")
    assert_records_close(assembled["off_diagonal"], single["off_diagonal"], "off_diagonal")
    assert assembled["loss"] == single["loss"]


def test_fan_in_refuses_records_that_do_not_cover_the_analysis():
    plan = plan_blocks(SPEC, None, None, OPTIONS, model=_model(), data=_data())
    part = _run(only=BlockShare(blocks=(next(iter(plan.blocks)),)))
    with pytest.raises(ValueError, match="missing"):
        _run(measured=MeasuredBlocks.from_json(blocks=part["blocks"], off_diagonal=[]))
