"""An analysis planned before it is queued, torch-free: its blocks, its cost, fan out or not.

The API plans every ``analyze`` job at submission (docs/operations.md#fan-out-at-submission),
from what it already holds: the model's config (Hugging Face) or spec (reference), the
checkpoint's and the dataset's stored safetensors headers, and the options.

* **Parameters.** A Hugging Face model's ``named_parameters()`` are a function of its config
  (:func:`hf_parameter_shapes`; the worker loads a checkpoint only if it matches them
  exactly). A reference model's are its checkpoint's tensors, which the worker also requires
  to match them exactly (:func:`checkpoint_shapes`).
* **Blocks** by the engine's own rules (``curvplan_core.blocks``), so a fan-out names the
  blocks the engine will find (:func:`plan_blocks`).
* **Cost** by the cost model (``curvplan_core.cost_model``) at the prior milliseconds per
  product, from the parameters and the tokens of the dataset (:func:`sample_size`).
* **Decision** (:func:`plan_analysis`): fan out when ``options.fan_out`` says so, else when the
  estimated spectra take longer than ``fan_out_min_seconds`` and at least two gpu worker
  slots are live; refuse with ``too-large`` (the smallest plan cannot fit the worker's memory
  limit) or ``over-time-limit`` (an attempt's estimate exceeds its kind's time limit), each
  naming the estimate and the options that shrink it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from curvplan.types.huggingface import GPT2Config, HuggingFaceModel, parse_hf_config
from curvplan.types.jobs import AnalyzeBlocksJobCreate, AnalyzeJobCreate
from curvplan.types.options import AnalysisOptions
from curvplan.types.spec import ModelSpec
from curvplan_core import blocks as block_rules
from curvplan_core import cost_model
from curvplan_core.blocks import Shape
from curvplan_core.fanout_groups import (
    CHILD_KIND,
    MIN_GROUPS,
    Group,
    WorkItem,
    child_name,
    group_count,
    lpt_groups,
)
from curvplan_core.jobs.records import NewChild

SPECTRA_STAGES = ("blocks", "off_diagonal")
"""The stages a fan-out's children run; the parent's fan-in runs the others."""

PARAMETER_STATE_COPIES = 4
"""Parameter-sized tensors any analysis holds at once, at the least: the weights, the gradient
at w*, a product's input and its output (the graph cache and activations come on top)."""


# --------------------------------------------------------------------------- parameters
def hf_parameter_shapes(config: Mapping[str, Any]) -> dict[str, Shape]:
    """``named_parameters()`` (name → shape) of ``*ForCausalLM(config)`` in transformers,
    a tied ``lm_head`` once (under the embedding's name)."""
    arch = parse_hf_config(dict(config))
    shapes: dict[str, Shape] = {}
    if isinstance(arch, GPT2Config):
        d, inner = arch.n_embd, arch.n_inner or 4 * arch.n_embd
        shapes["transformer.wte.weight"] = (arch.vocab_size, d)
        shapes["transformer.wpe.weight"] = (arch.n_positions, d)
        for i in range(arch.n_layer):
            p = f"transformer.h.{i}"
            for name, shape in (
                ("ln_1.weight", (d,)),
                ("ln_1.bias", (d,)),
                ("attn.c_attn.weight", (d, 3 * d)),
                ("attn.c_attn.bias", (3 * d,)),
                ("attn.c_proj.weight", (d, d)),
                ("attn.c_proj.bias", (d,)),
                ("ln_2.weight", (d,)),
                ("ln_2.bias", (d,)),
                ("mlp.c_fc.weight", (d, inner)),
                ("mlp.c_fc.bias", (inner,)),
                ("mlp.c_proj.weight", (inner, d)),
                ("mlp.c_proj.bias", (d,)),
            ):
                shapes[f"{p}.{name}"] = shape
        shapes["transformer.ln_f.weight"] = (d,)
        shapes["transformer.ln_f.bias"] = (d,)
        if not arch.tie_word_embeddings:
            shapes["lm_head.weight"] = (arch.vocab_size, d)
        return shapes
    h, inner, hd = arch.hidden_size, arch.intermediate_size, arch.resolved_head_dim
    q, kv = arch.num_attention_heads * hd, arch.kv_heads * hd
    qkv_bias, o_bias = arch._q_k_v_o_bias()
    mlp_bias = arch._mlp_bias()
    shapes["model.embed_tokens.weight"] = (arch.vocab_size, h)
    for i in range(arch.num_hidden_layers):
        p = f"model.layers.{i}"
        for name, (out, n_in), bias in (
            ("self_attn.q_proj", (q, h), qkv_bias),
            ("self_attn.k_proj", (kv, h), qkv_bias),
            ("self_attn.v_proj", (kv, h), qkv_bias),
            ("self_attn.o_proj", (h, q), o_bias),
            ("mlp.gate_proj", (inner, h), mlp_bias),
            ("mlp.up_proj", (inner, h), mlp_bias),
            ("mlp.down_proj", (h, inner), mlp_bias),
        ):
            shapes[f"{p}.{name}.weight"] = (out, n_in)
            if bias:
                shapes[f"{p}.{name}.bias"] = (out,)
        shapes[f"{p}.input_layernorm.weight"] = (h,)
        shapes[f"{p}.post_attention_layernorm.weight"] = (h,)
    shapes["model.norm.weight"] = (h,)
    if not arch.tie_word_embeddings:
        shapes["lm_head.weight"] = (arch.vocab_size, h)
    return shapes


def checkpoint_shapes(headers: Sequence[Mapping[str, Any] | None]) -> dict[str, Shape] | None:
    """name → shape of the tensors of a checkpoint's shards (their stored headers' tensor
    lists); None when a shard's header is not known (a ``file://`` artifact no worker read)."""
    shapes: dict[str, Shape] = {}
    for header in headers:
        if header is None:
            return None
        for name, info in header.items():
            shapes[name] = tuple(int(x) for x in info.get("shape") or [])
    return shapes


Model = ModelSpec | HuggingFaceModel
"""The validated ``model`` of an analyze request (``curvplan.types.model_source``)."""


def parameter_shapes(
    model: Model, checkpoint_headers: Sequence[Mapping[str, Any] | None]
) -> dict[str, Shape] | None:
    """The engine's parameters (name → shape): from a Hugging Face model's config, else from
    the reference checkpoint's headers (None when one is not known)."""
    if isinstance(model, HuggingFaceModel):
        return hf_parameter_shapes(model.config)
    return checkpoint_shapes(checkpoint_headers)


# --------------------------------------------------------------------------- blocks
@dataclass(frozen=True)
class BlockPlan:
    """The blocks an analysis measures (name → parameters, in the engine's order) and its
    off-diagonal pairs (row, col, parameters of row, of col)."""

    blocks: dict[str, int]
    pairs: list[tuple[str, str, int, int]]


def plan_blocks(model: Model, shapes: Mapping[str, Shape], options: AnalysisOptions) -> BlockPlan:
    """The blocks and pairs the engine's ``analyze`` measures for this model and these
    options (``curvature.analyze.plan_blocks`` without building the model). Raises
    ``BlockError`` / ``UnknownBlocks`` where the engine would refuse the options."""
    names = list(shapes)
    if options.block_definitions:
        all_blocks = block_rules.custom_blocks(names, options.block_definitions)
    elif isinstance(model, HuggingFaceModel):
        model_type = str(model.config.get("model_type", ""))
        all_blocks = block_rules.uniform_blocks(shapes, model_type)
    else:
        all_blocks = block_rules.ordered(block_rules.default_blocks(names))
    chosen = block_rules.select_blocks(all_blocks, options.blocks)
    sizes = block_rules.block_sizes(chosen, shapes)
    pairs = block_rules.selected_pairs(list(chosen), options.off_diagonal)
    return BlockPlan(sizes, [(r, c, sizes[r], sizes[c]) for r, c in pairs])


# --------------------------------------------------------------------------- the sample
@dataclass(frozen=True)
class Sample:
    """The evaluation sample's size: examples, and tokens (examples × sequence length)."""

    n_examples: int
    tokens: float


def sample_size(model: Model, header: Mapping[str, Any] | None) -> Sample | None:
    """Examples and tokens of a dataset from its stored header (``input_ids`` of a Hugging
    Face dataset, ``inputs`` of a reference one); None when it is not known."""
    if header is None:
        return None
    info = header.get("input_ids" if isinstance(model, HuggingFaceModel) else "inputs")
    shape = (info or {}).get("shape") or []
    if not shape:
        return None
    n = int(shape[0])
    length = int(shape[1]) if len(shape) >= 2 else 1
    return Sample(n, float(n * length))


# --------------------------------------------------------------------------- the decision
@dataclass(frozen=True)
class Limits:
    """What the service allows and has: live gpu worker slots, the seconds an attempt of each
    kind may run, the workers' memory limit (None: not known here), the spectra seconds above
    which an analysis fans out, and the basis budget of one block's Lanczos."""

    live_workers: int
    time_limits: Mapping[str, float]
    memory_limit_bytes: int | None = None
    fan_out_min_seconds: float = 60.0
    basis_budget: int | None = None


@dataclass(frozen=True)
class Refusal:
    """Why an analysis cannot be queued: ``too-large`` or ``over-time-limit``, with the
    options field that shrinks it and the message (naming the estimate)."""

    type: str
    field: tuple[str, ...]
    message: str


@dataclass
class AnalysisPlan:
    """The outcome of :func:`plan_analysis`."""

    estimate: cost_model.CostEstimate
    blocks: BlockPlan
    groups: list[Group] = field(default_factory=list)  # empty: one process
    reason: str = ""
    fan_in_seconds: float = 0.0
    memory_bytes: float = 0.0
    refusals: list[Refusal] = field(default_factory=list)

    @property
    def fans_out(self) -> bool:
        return len(self.groups) >= MIN_GROUPS

    @property
    def eta_seconds(self) -> float:
        """The prior ETA: the slowest child and the fan-in, else the whole estimate."""
        if self.fans_out:
            return max(g.cost for g in self.groups) + self.fan_in_seconds
        return self.estimate.seconds


def _stage_seconds(estimate: cost_model.CostEstimate, names: Sequence[str]) -> float:
    return sum(s.seconds for s in estimate.stages if s.stage in names)


def _items(estimate: cost_model.CostEstimate, plan: BlockPlan) -> list[WorkItem]:
    """Every block and pair as an item costed in seconds by the cost model: its expected
    products at the prior ms per product × its depth weight (``cost_model.depth_weights``:
    a block product costs more the nearer the block is to the input)."""
    ms = estimate.ms_per_product / 1000.0
    blocks = (estimate.stage("blocks") or cost_model.StageCost("blocks", 0, 0, 0)).items or {}
    pairs = (estimate.stage("off_diagonal") or cost_model.StageCost("p", 0, 0, 0)).items or {}
    products = {name: blocks.get(name, 0.0) for name in plan.blocks}
    products.update({f"{r}|{c}": pairs.get(f"{r}|{c}", 0.0) for r, c, *_ in plan.pairs})
    weight = cost_model.depth_weights(products, plan.pairs)
    items = [WorkItem(name, products[name] * ms * weight[name]) for name in plan.blocks]
    items += [
        WorkItem(f"{r}|{c}", products[f"{r}|{c}"] * ms * weight[f"{r}|{c}"], (r, c))
        for r, c, *_ in plan.pairs
    ]
    return items


def memory_floor(
    plan: BlockPlan, n_params: int, options: AnalysisOptions, budget: int | None
) -> tuple[float, dict[str, float]]:
    """The least memory an analysis needs (bytes) and its parts: :data:`PARAMETER_STATE_COPIES`
    parameter-sized tensors and the largest bounded Lanczos basis
    (``cost_model.largest_basis_bytes``, as the engine's memory plan counts it)."""
    weights = PARAMETER_STATE_COPIES * n_params * cost_model.basis_itemsize(options.precision)
    basis = cost_model.largest_basis_bytes(plan.blocks, options, n_params, budget)
    return float(weights + basis), {"parameters": float(weights), "Lanczos basis": float(basis)}


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def plan_analysis(
    model: Model,
    options: AnalysisOptions,
    shapes: Mapping[str, Shape],
    sample: Sample,
    limits: Limits,
) -> AnalysisPlan:
    """Cost, fan-out and admission of one analysis (module docstring)."""
    blocks = plan_blocks(model, shapes, options)
    n_params = sum(math.prod(s) for s in shapes.values())
    estimate = cost_model.estimate(
        blocks=blocks.blocks,
        pairs=blocks.pairs,
        n_params=n_params,
        n_examples=sample.n_examples,
        tokens=sample.tokens,
        options=options,
    )
    spectra = _stage_seconds(estimate, SPECTRA_STAGES)
    plan = AnalysisPlan(estimate, blocks)
    forced = options.fan_out
    if len(blocks.blocks) < MIN_GROUPS:
        plan.reason = "one process: fewer than two blocks"
    elif forced is False:
        plan.reason = "one process: options.fan_out is false"
    elif forced is None and spectra <= limits.fan_out_min_seconds:
        plan.reason = (
            f"one process: the spectra take {cost_model.format_duration(spectra)}, not more "
            f"than the fan-out threshold of {limits.fan_out_min_seconds:g} s"
        )
    elif forced is None and limits.live_workers < MIN_GROUPS:
        plan.reason = f"one process: {limits.live_workers} gpu worker slot(s) live"
    else:
        n = group_count(options.fan_out_groups, limits.live_workers, len(blocks.blocks))
        groups = lpt_groups(_items(estimate, blocks), n)
        if len(groups) >= MIN_GROUPS:
            plan.groups = groups
            plan.fan_in_seconds = estimate.seconds - spectra
            why = "options.fan_out" if forced else f"spectra {cost_model.format_duration(spectra)}"
            plan.reason = f"fanned out over {len(groups)} jobs ({why})"
        else:
            plan.reason = "one process: one group"
    plan.refusals = _refusals(plan, n_params, options, limits)
    return plan


def _refusals(
    plan: AnalysisPlan, n_params: int, options: AnalysisOptions, limits: Limits
) -> list[Refusal]:
    out = []
    memory, parts = memory_floor(plan.blocks, n_params, options, limits.basis_budget)
    plan.memory_bytes = memory
    limit = limits.memory_limit_bytes
    if limit is not None and memory > limit * cost_model.HOST_SAFETY:
        shown = ", ".join(f"{k} {_gib(v)}" for k, v in parts.items())
        out.append(
            Refusal(
                "too-large",
                ("options",),
                f"the analysis needs at least {_gib(memory)} ({shown}), more than "
                f"{cost_model.HOST_SAFETY:g} × the workers' memory limit of {_gib(limit)} "
                "(CURVPLAN_WORKER_MEMORY_LIMIT); shrink it with blocks (fewer or smaller "
                "blocks), precision float32, top_d 0, or a smaller model",
            )
        )
    attempts = [(CHILD_KIND, g.cost, f"block group {i + 1}") for i, g in enumerate(plan.groups)]
    if plan.fans_out:
        attempts.append(("analyze", plan.fan_in_seconds, "the fan-in"))
    else:
        attempts.append(("analyze", plan.estimate.seconds, "the analysis"))
    for kind, seconds, what in attempts:
        allowed = limits.time_limits.get(kind)
        if allowed is not None and seconds > allowed:
            out.append(
                Refusal(
                    "over-time-limit",
                    ("options",),
                    f"{what} is estimated at {seconds:.0f} s (the analysis: "
                    f"{cost_model.describe(plan.estimate)}), above its {allowed:g} s limit "
                    f"(the {kind} time limit, CURVPLAN_JOB_TIME_LIMITS). Shorten it with "
                    f"{cost_model.TIME_OPTIONS}",
                )
            )
            break
    return out


@dataclass(frozen=True)
class PlannedChild:
    """One ``analyze_blocks`` child of a fanned-out analysis: its name, its request (the
    create model, built from the parent's validated one) and its prior ETA in seconds."""

    name: str
    request: AnalyzeBlocksJobCreate
    eta_seconds: float

    def stored(self) -> NewChild:
        """``{kind, name, request, eta_seconds}`` as ``lifecycle.insert_children`` inserts the
        child (the request's JSON)."""
        return NewChild(
            kind=CHILD_KIND,
            name=self.name,
            request=self.request.model_dump(mode="json", exclude_none=True),
            eta_seconds=self.eta_seconds,
        )


def child_requests(body: AnalyzeJobCreate, plan: AnalysisPlan) -> list[PlannedChild]:
    """The ``analyze_blocks`` children of a fanned-out analysis, each with the parent's model,
    checkpoint, dataset, resources and options (the parent's typed values, not parsed again)."""
    total = len(plan.groups)
    return [
        PlannedChild(
            name=child_name(i + 1, total, group),
            request=AnalyzeBlocksJobCreate(
                kind="analyze_blocks",
                model=body.model,
                checkpoint=body.checkpoint,
                dataset=body.dataset,
                options=body.options,
                resources=body.resources,
                blocks=list(group.blocks),
                pairs=[(r, c) for r, c in group.pairs],
                estimated_cost=group.cost,
            ),
            eta_seconds=group.cost,
        )
        for i, group in enumerate(plan.groups)
    ]
