"""Per-block curvature summary (docs/formulas.md#curvature)."""

from __future__ import annotations

from curvplan.types.planner import BlockCurvature, BlockSummary, CurvatureSection, Missing
from curvplan_core.planner import formulas

# λ_min below −NEGATIVE_TOLERANCE·max spectral norm counts as negative curvature (above it, it is
# within the typical accuracy of a Lanczos / power-iteration estimate).
NEGATIVE_TOLERANCE = 1e-3


def summarize_blocks(
    blocks: list[BlockCurvature],
) -> tuple[CurvatureSection, list[str]]:
    """Which blocks carry the curvature, the heterogeneity ratio max/min spectral norm, the
    per-block GD step-size ceilings 2/λ_max (docs/formulas.md#curvature), and the blocks whose
    λ_min is
    clearly negative (w* is not a minimum there). Returns the section and the negative blocks."""
    total = sum(b.spectral_norm for b in blocks)
    max_norm = max(b.spectral_norm for b in blocks)
    summaries = []
    negative = []
    for b in blocks:
        is_negative = b.lambda_min < -NEGATIVE_TOLERANCE * max_norm
        if is_negative:
            negative.append(b.name)
        summaries.append(
            BlockSummary(
                name=b.name,
                spectral_norm=b.spectral_norm,
                lambda_max=b.lambda_max,
                lambda_min=b.lambda_min,
                share_of_total_norm=b.spectral_norm / total if total > 0 else 0.0,
                block_threshold=2.0 / b.lambda_max if b.lambda_max > 0 else None,
                negative_curvature=is_negative,
                trace=b.trace,
            )
        )
    ranked = sorted(blocks, key=lambda b: b.spectral_norm, reverse=True)
    min_norm = min(b.spectral_norm for b in blocks)
    missing = []
    ratio = None
    if min_norm > 0:
        ratio = max_norm / min_norm
    else:
        missing.append(
            Missing(
                item="heterogeneity_ratio",
                reason="a block has spectral norm 0, so max/min is unbounded",
            )
        )
    if any(s.block_threshold is None for s in summaries):
        missing.append(
            Missing(
                item="block_threshold",
                reason="blocks with λ_max ≤ 0 have no GD sharpness threshold 2/λ_max",
            )
        )
    section = CurvatureSection(
        blocks=summaries,
        top_blocks=[b.name for b in ranked[:3]],
        heterogeneity_ratio=ratio,
        heterogeneity_formula=formulas.HETEROGENEITY,
        block_threshold_formula=formulas.BLOCK_THRESHOLD,
        missing=missing,
    )
    return section, negative
