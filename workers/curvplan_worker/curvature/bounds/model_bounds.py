"""Entry point for the engine: the paper's bounds evaluated on a reference-family model.

:func:`block_bounds_for_model` captures, with forward hooks, each layer's input X, the
LayerNorm inputs (X + F and S) and outputs (Y and Z) per SAMPLE, evaluates Petrov et al. 2025
Theorems 5-6 (with the S3 general-loss form) per sample, and returns per engine block name
(``layers.{i}.q|k|v|ffn_in|ffn_out``, ``.ln1``/``.ln2``) a record
``{"value", "max_over_samples", "formula", "corrections", "applicable", "reason"}``.

``value`` bounds the block of the Hessian of the *dataset mean* loss: by the triangle
inequality ||(1/n) sum_i H_i|| <= (1/n) sum_i ||H_i||, so it is the mean of the per-sample bounds;
``max_over_samples`` bounds every per-sample Hessian (the M of Theorem 7).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, NotRequired, TypedDict

import torch
from torch import Tensor, nn

from curvplan_worker.curvature.bounds.attention import (
    attention_jacobian_bounds,
    attention_scalars,
    attention_second_bounds,
)
from curvplan_worker.curvature.bounds.block import theorem6_bounds
from curvplan_worker.curvature.bounds.layernorm import (
    layernorm_hessian_norm,
    layernorm_hessian_norm_closed_form,
    layernorm_jacobian_norm,
    lemma4_bounds,
)
from curvplan_worker.curvature.bounds.options import BoundOptions
from curvplan_worker.curvature.bounds.theory import BLOCK_KEYS, TheoryWeights, block_forward

THEORY = (
    "Petrov, Kiselev, Meshkov, Grabovoy 2025 (arXiv 2510.16927), Theorems 1-6, Lemma 4, "
    "Prop. 10, with the corrections of docs/formulas.md#bounds"
)
ENGINE_NAME = {"1": "ffn_in", "2": "ffn_out", "K": "k", "Q": "q", "V": "v"}
PAPER_NAME = {"1": "W_1", "2": "W_2", "K": "W_K", "Q": "W_Q", "V": "W_V"}


class BoundsInputError(ValueError):
    """Inputs or targets that the bounds cannot use; the message names the field."""


def model_reasons(spec: Any) -> tuple[list[str], list[str]]:
    """(architecture reasons, loss reasons) why ``spec`` is outside the theory.

    Architecture: single head, post-LN LayerNorm without affine, ReLU, no biases, no W_O, no
    causal mask. Loss: MSE on the last block's output (regression without head/final norm).
    An eps > 0 is not a reason: the LN norms here include eps.
    """
    arch: list[str] = []
    if spec.n_heads != 1:
        arch.append(f"n_heads={spec.n_heads}: the theory is single-head")
    if spec.norm != "layernorm":
        arch.append(f"norm={spec.norm}: the theory's norm is LayerNorm")
    if spec.norm_position != "post":
        arch.append("norm_position=pre: the theory is post-LN")
    if spec.activation != "relu":
        arch.append(
            f"activation={spec.activation}: second derivative nonzero (xi_11 != 0, "
            "dJ_SY/dY != 0), the FFN and block bounds are invalid"
        )
    if spec.bias:
        arch.append("bias=true: the theory has no biases")
    if spec.attn_output_proj:
        arch.append("attn_output_proj=true: the theory has no W_O")
    if spec.norm_affine:
        arch.append("norm_affine=true: the theory fixes gamma=1, beta=0")
    task = spec.task
    loss: list[str] = []
    if task.type == "causal_lm":
        arch.append("causal mask: the theory's attention is unmasked")
    if task.type != "regression":
        loss.append(f"task={task.type}: cross-entropy loss, the theory's loss is MSE")
    elif task.output_dim is not None:
        loss.append("regression with a head: the loss is not MSE of the last block's output")
    if spec.use_final_norm:
        loss.append("final_norm=true: a norm follows the last block")
    return arch, loss


def scope_reasons(spec: Any) -> list[str]:
    """Why the per-block bounds, though valid block by block, do not bound the WHOLE model's
    per-sample Hessian (the M of Petrov et al. 2025 Theorem 7): Theorems 5-6 treat one block
    whose output the loss reads, with no parameters before it."""
    reasons: list[str] = []
    if spec.n_layers > 1:
        reasons.append(
            f"n_layers={spec.n_layers}: Theorems 5-6 bound one block read by the loss; only the "
            "last layer's blocks are bounded and M_tr/M_SA cover the last layer's parameters, "
            "not the whole model's Hessian"
        )
    task = spec.task
    if getattr(task, "input_dim", None) is not None or getattr(task, "vocab_size", None):
        reasons.append(
            "embed: an input embedding/projection precedes the block; its Hessian rows are not "
            "bounded, so M_tr is not a bound on the whole model's Hessian"
        )
    if spec.positional == "learned":
        reasons.append(
            "positional=learned: position embeddings are parameters outside the theory's block "
            "(not bounded)"
        )
    return reasons


class BoundOptionsJson(TypedDict):
    """:class:`BoundOptions` as the result records them (``bounds.options``)."""

    mode: str
    c_A: str
    A_norm: str
    ln_norms: str
    sigma_min: str
    max_dense_entries: int
    max_samples: int | None


class BlockBound(TypedDict):
    """One block's bound: the mean of the per-sample bounds (``value``, a bound on the dataset
    mean's block) and their max, the formula and corrections, or why it does not apply. The
    LayerNorm blocks carry its norms, the paper's blocks their names in the paper."""

    value: float | None
    max_over_samples: float | None
    formula: str | None
    corrections: list[str]
    applicable: bool
    reason: str | None
    paper_blocks: NotRequired[list[str]]
    jacobian_norm: NotRequired[float | None]
    hessian_norm: NotRequired[float | None]


class PairBound(BlockBound):
    """An off-diagonal block's bound, H[row, col]."""

    row: str
    col: str


class LayerNormBounds(TypedDict):
    """A LayerNorm's exact norms w.r.t. its input and Lemma 4's bounds, max over samples (when
    the LayerNorm formulas apply)."""

    applicable: bool
    jacobian_norm: NotRequired[float]
    hessian_norm: NotRequired[float]
    hessian_norm_closed_form: NotRequired[float]
    lemma4_jacobian_bound: NotRequired[float]
    lemma4_hessian_bound: NotRequired[float]
    reason: str | None


class LayerNormNorms(TypedDict):
    """One sample's LayerNorm norms (:func:`_ln_record`)."""

    jacobian_norm: float
    hessian_norm: float
    hessian_norm_closed_form: float
    lemma4_jacobian_bound: float
    lemma4_hessian_bound: float


class AttentionBounds(TypedDict):
    """Max over samples of the attention-only bounds ||G_k|| and ||Phi_kl|| (App. B.6)."""

    applicable: Literal[True]
    reason: None
    formula: str
    G_V: float
    G_Q: float
    G_K: float
    Phi_VV: float
    Phi_VQ: float
    Phi_VK: float
    Phi_QV: float
    Phi_KV: float
    Phi_QQ: float
    Phi_KK: float
    Phi_QK: float
    Phi_KQ: float


class AttentionOutside(TypedDict):
    """Why the attention sub-layer is outside the theory."""

    applicable: Literal[False]
    reason: str


class LayerBounds(TypedDict):
    """One layer's record: whether its bounds apply (and why not), its LayerNorms' norms, the
    model-Hessian constants M_tr and M_SA (max over samples), its attention bounds and, where
    the architecture is the paper's, Theorem 6's ingredients and ||H_tr|| per block pair."""

    applicable: bool
    reasons: list[str]
    ln_norms: dict[str, LayerNormBounds]
    M_tr: float | None
    M_SA: float | None
    attention: AttentionBounds | AttentionOutside
    ingredients: NotRequired[dict[str, float]]
    H_tr: NotRequired[dict[str, float]]
    corrections: NotRequired[list[str]]
    M_tr_mean: NotRequired[float]


class ModelBounds(TypedDict):
    """The paper's bounds on a model (:func:`block_bounds_for_model`): whether the whole model
    is inside the theory (and why not), each block's and pair's bound, each layer's record,
    and Theorem 7's M_tr and M_SA from the last layer."""

    theory: str
    options: BoundOptionsJson
    applicable: bool
    reasons: list[str]
    M_tr_scope: str
    n_samples: int
    blocks: dict[str, BlockBound]
    off_diagonal: list[PairBound]
    layers: dict[str, LayerBounds]
    M_tr: float | None
    M_SA: float | None


@dataclass(frozen=True)
class _LayerResult:
    """One layer's part of :class:`ModelBounds`."""

    layer: LayerBounds
    blocks: dict[str, BlockBound]
    off_diagonal: list[PairBound]


def _options_json(opts: BoundOptions) -> BoundOptionsJson:
    return {
        "mode": opts.mode,
        "c_A": opts.c_A,
        "A_norm": opts.A_norm,
        "ln_norms": opts.ln_norms,
        "sigma_min": opts.sigma_min,
        "max_dense_entries": opts.max_dense_entries,
        "max_samples": opts.max_samples,
    }


def attention_reasons(spec: Any) -> list[str]:
    """Why the attention sub-layer itself is outside the theory (then ||G_k||, ||Phi_kl||
    bounds of Petrov et al. 2025 App. B.6 do not hold either)."""
    reasons = []
    if spec.n_heads != 1:
        reasons.append(f"n_heads={spec.n_heads}")
    if spec.bias:
        reasons.append("biases")
    if spec.attn_output_proj:
        reasons.append("W_O")
    if spec.task.type == "causal_lm":
        reasons.append("causal mask")
    return reasons


def _attention_record(
    store: dict[str, Tensor], layer: int, weights: TheoryWeights, opts: BoundOptions
) -> AttentionBounds:
    """Max over samples of the attention-only bounds ||G_k||, ||Phi_kl|| (App. B.6, Lemma 2),
    evaluated at the attention input (X for post-LN, LN(X) for pre-LN)."""
    inputs = store[f"{layer}.attn.in"]
    per: list[dict[str, float]] = []
    for s in range(inputs.shape[0]):
        scal = attention_scalars(inputs[s], weights.W_Q, weights.W_K, weights.W_V, opts)
        g = attention_jacobian_bounds(scal)
        phi = attention_second_bounds(scal)
        per.append(
            {
                **{f"G_{k}": v for k, v in g.items()},
                **{f"Phi_{i}{j}": v for (i, j), v in phi.items()},
            }
        )

    def worst(key: str) -> float:
        return max(p[key] for p in per)

    return {
        "applicable": True,
        "reason": None,
        "formula": "bounds on ||dF/dW_k|| and ||d^2F/dW_k dW_l|| of the attention output "
        "(Petrov et al. 2025 App. B.6 / Lemma 2, corrected); max over samples",
        "G_V": worst("G_V"),
        "G_Q": worst("G_Q"),
        "G_K": worst("G_K"),
        "Phi_VV": worst("Phi_VV"),
        "Phi_VQ": worst("Phi_VQ"),
        "Phi_VK": worst("Phi_VK"),
        "Phi_QV": worst("Phi_QV"),
        "Phi_KV": worst("Phi_KV"),
        "Phi_QQ": worst("Phi_QQ"),
        "Phi_KK": worst("Phi_KK"),
        "Phi_QK": worst("Phi_QK"),
        "Phi_KQ": worst("Phi_KQ"),
    }


def _layer_weights(model: nn.Module, i: int) -> TheoryWeights:
    params = dict(model.named_parameters())

    def weight(name: str) -> Tensor:
        return params[f"layers.{i}.{name}.weight"].detach().to("cpu", torch.float64).T

    return TheoryWeights(
        W_Q=weight("attn.q"),
        W_K=weight("attn.k"),
        W_V=weight("attn.v"),
        W_1=weight("ffn_in"),
        W_2=weight("ffn_out"),
    )


def _capture(model: nn.Module, n_layers: int, inputs: Tensor) -> dict[str, Tensor]:
    """Run ``model`` in fp64 (a functional call, live weights untouched) and record, per layer,
    the block input X, the inputs/outputs of ln1 and ln2 (for post-LN: X + F, Y, S, Z)."""
    store: dict[str, Tensor] = {}
    handles = []

    def pre(key: str) -> Callable[[nn.Module, tuple[Tensor, ...]], None]:
        def hook(_module: nn.Module, args: tuple[Tensor, ...]) -> None:
            store[key] = args[0].detach().to("cpu")

        return hook

    def post(key: str) -> Callable[[nn.Module, tuple[Tensor, ...], Tensor], None]:
        def hook(_module: nn.Module, _args: tuple[Tensor, ...], output: Tensor) -> None:
            store[key] = output.detach().to("cpu")

        return hook

    modules = dict(model.named_modules())
    for i in range(n_layers):
        handles.append(modules[f"layers.{i}"].register_forward_pre_hook(pre(f"{i}.X")))
        handles.append(modules[f"layers.{i}.attn"].register_forward_pre_hook(pre(f"{i}.attn.in")))
        for ln in ("ln1", "ln2"):
            handles.append(
                modules[f"layers.{i}.{ln}"].register_forward_pre_hook(pre(f"{i}.{ln}.in"))
            )
            handles.append(modules[f"layers.{i}.{ln}"].register_forward_hook(post(f"{i}.{ln}.out")))
    params = {n: p.detach().to(torch.float64) for n, p in model.named_parameters()}
    buffers = {
        n: b.to(torch.float64) if b.is_floating_point() else b for n, b in model.named_buffers()
    }
    x = inputs.to(torch.float64) if inputs.is_floating_point() else inputs
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            store["output"] = torch.func.functional_call(model, {**params, **buffers}, (x,))
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    return store


def _ln_record(x: Tensor, eps: float, gamma: Tensor | None, sigma_min: str) -> LayerNormNorms:
    jac_l4, hess_l4 = lemma4_bounds(x, eps, sigma_min)
    return {
        "jacobian_norm": layernorm_jacobian_norm(x, eps, gamma),
        "hessian_norm": layernorm_hessian_norm(x, eps, gamma),
        "hessian_norm_closed_form": layernorm_hessian_norm_closed_form(x, eps, gamma),
        "lemma4_jacobian_bound": jac_l4,
        "lemma4_hessian_bound": hess_l4,
    }


def _formula(i: str, j: str) -> str:
    return (
        f"||d2l/dZ2|| ||J_Z B_{i}|| ||J_Z B_{j}|| + ||dl/dZ|| min(||H_tr^({i},{j})||, "
        f"||H_tr^({j},{i})||), ||H_tr^(i,j)|| <= ||J_Z|| ||xi_ij|| + ||B_i|| ||H_Z|| ||B_j|| "
        "(Petrov et al. 2025 Thms 5-6, S3 general-loss form); mean over samples"
    )


def _validate(spec: Any, inputs: Tensor, targets: Tensor | None) -> None:
    if not isinstance(inputs, Tensor) or inputs.dim() < 2:
        raise BoundsInputError("inputs: expected a tensor (n, seq, ...) with n >= 1")
    if inputs.shape[0] < 1:
        raise BoundsInputError("inputs: empty sample")
    task = spec.task
    if task.type == "regression" and task.output_dim is None and targets is not None:
        expected = (inputs.shape[0], inputs.shape[1], spec.d_model)
        if tuple(targets.shape) != expected:
            raise BoundsInputError(
                f"targets: expected shape {expected} for regression without head, "
                f"got {tuple(targets.shape)}"
            )


def block_bounds_for_model(
    model: nn.Module,
    spec: Any,
    inputs: Tensor,
    targets: Tensor | None,
    options: Mapping[str, Any] | BoundOptions | None = None,
) -> ModelBounds:
    """The paper's theoretical block bounds for ``model`` at its current weights w*.

    Petrov et al. 2025, Theorems 5-6 (blocks W_1, W_2, W_K, W_Q, W_V of each post-LN layer),
    evaluated per sample from forward-hook activations; LayerNorm norms from Theorems 2-3
    (exact) and Lemma 4. Returns ``{"theory", "options", "applicable", "reasons", "blocks",
    "off_diagonal", "layers", "M_tr", "M_SA", "n_samples"}``; blocks outside the theory have
    ``applicable: false``, ``value: null`` and a ``reason``; parts that still hold (LayerNorm
    norms always, the block's model-Hessian bounds ||H_tr|| when only the loss differs) are kept.
    """
    from curvplan.types.spec import parse_spec

    spec = parse_spec(spec)
    opts = BoundOptions.from_mapping(options)
    _validate(spec, inputs, targets)
    n = inputs.shape[0] if opts.max_samples is None else min(inputs.shape[0], opts.max_samples)
    inputs = inputs[:n]
    targets = targets[:n] if targets is not None else None
    arch, loss = model_reasons(spec)
    if targets is None and not loss:
        loss = ["no targets given: the loss gradient norm cannot be evaluated"]
    store = _capture(model, spec.n_layers, inputs)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # per-sample tensors are tiny: threading only adds overhead
    try:
        return _assemble(model, spec, opts, store, targets, arch, loss, n)
    finally:
        torch.set_num_threads(threads)


def _assemble(
    model: nn.Module,
    spec: Any,
    opts: BoundOptions,
    store: dict[str, Tensor],
    targets: Tensor | None,
    arch: list[str],
    loss: list[str],
    n: int,
) -> ModelBounds:
    eps = float(spec.ln_eps)
    scope = scope_reasons(spec)
    result: ModelBounds = {
        "theory": THEORY,
        "options": _options_json(opts),
        # the whole model inside the theory: every block bounded and M_tr bounds the full
        # per-sample Hessian (Theorem 7's M); block records keep their own `applicable`
        "applicable": not arch and not loss and not scope,
        "reasons": arch + loss + scope,
        "M_tr_scope": f"layers.{spec.n_layers - 1} (W_1, W_2, W_K, W_Q, W_V)",
        "n_samples": n,
        "blocks": {},
        "off_diagonal": [],
        "layers": {},
        "M_tr": None,
        "M_SA": None,
    }
    params = dict(model.named_parameters())
    for layer in range(spec.n_layers):
        name = f"layers.{layer}"
        last = layer == spec.n_layers - 1
        layer_loss = (
            list(loss)
            if last
            else ["downstream layers follow this block: the loss is not MSE of its output"]
        )
        record = _layer_bounds(
            store, layer, spec, eps, opts, targets, params, model, arch, layer_loss
        )
        result["layers"][name] = record.layer
        result["blocks"].update(record.blocks)
        result["off_diagonal"].extend(record.off_diagonal)
        if last and record.layer["applicable"]:
            result["M_tr"] = record.layer["M_tr"]
            result["M_SA"] = record.layer["M_SA"]
    return result


def _layer_bounds(
    store: dict[str, Tensor],
    layer: int,
    spec: Any,
    eps: float,
    opts: BoundOptions,
    targets: Tensor | None,
    params: dict[str, Tensor],
    model: nn.Module,
    arch: list[str],
    loss: list[str],
) -> _LayerResult:
    name = f"layers.{layer}"
    n = store[f"{layer}.X"].shape[0]
    ln_records: dict[str, LayerNormBounds] = {}
    for ln in ("ln1", "ln2"):
        gamma = params.get(f"{name}.{ln}.weight")
        gamma = gamma.detach().to("cpu", torch.float64) if gamma is not None else None
        if spec.norm != "layernorm":
            ln_records[ln] = {
                "applicable": False,
                "reason": "RMSNorm: the LayerNorm formulas do not apply",
            }
            continue
        try:
            per = [
                _ln_record(store[f"{layer}.{ln}.in"][s], eps, gamma, opts.sigma_min)
                for s in range(n)
            ]
        except ValueError as exc:
            ln_records[ln] = {"applicable": False, "reason": str(exc)}
            continue
        ln_records[ln] = {
            "applicable": True,
            "jacobian_norm": max(p["jacobian_norm"] for p in per),
            "hessian_norm": max(p["hessian_norm"] for p in per),
            "hessian_norm_closed_form": max(p["hessian_norm_closed_form"] for p in per),
            "lemma4_jacobian_bound": max(p["lemma4_jacobian_bound"] for p in per),
            "lemma4_hessian_bound": max(p["lemma4_hessian_bound"] for p in per),
            "reason": None,
        }
    blocks: dict[str, BlockBound] = {}
    for ln in ("ln1", "ln2"):
        blocks[f"{name}.{ln}"] = {
            "value": None,
            "max_over_samples": None,
            "formula": "exact LayerNorm norms w.r.t. its input (Petrov et al. 2025 Thms 2-3, "
            "docs/formulas.md#bounds): 'jacobian_norm', 'hessian_norm' (max over samples)",
            "corrections": ["exact_ln_norms"],
            "applicable": False,
            "reason": "the theory has no LayerNorm parameters (gamma=1, beta=0 fixed); "
            "no bound on this block's Hessian",
            "jacobian_norm": ln_records[ln].get("jacobian_norm"),
            "hessian_norm": ln_records[ln].get("hessian_norm"),
        }
    att = attention_reasons(spec)
    attention: AttentionBounds | AttentionOutside = (
        {"applicable": False, "reason": "attention outside the theory: " + ", ".join(att)}
        if att
        else _attention_record(store, layer, _layer_weights(model, layer), opts)
    )
    layer_rec: LayerBounds = {
        "applicable": False,
        "reasons": arch + loss,
        "ln_norms": ln_records,
        "M_tr": None,
        "M_SA": None,
        "attention": attention,
    }
    off: list[PairBound] = []
    if arch:
        reason = "; ".join(arch)
        for key in BLOCK_KEYS:
            blocks[f"{name}.{ENGINE_NAME[key]}"] = _not_applicable(reason)
        return _LayerResult(layer_rec, blocks, off)
    weights = _layer_weights(model, layer)
    per_sample = []
    try:
        for s in range(n):
            X = store[f"{layer}.X"][s]
            acts = block_forward(X, weights, eps)
            z_model = store[f"{layer}.ln2.out"][s]
            if not torch.allclose(acts["Z"], z_model, rtol=1e-8, atol=1e-8):
                raise RuntimeError(
                    f"{name}: the model's block output differs from the theory block "
                    f"(max |diff| {float((acts['Z'] - z_model).abs().max()):.3g}); "
                    "the architecture is not the paper's"
                )
            target = (
                targets[s].to("cpu", torch.float64) if (targets is not None and not loss) else None
            )
            per_sample.append(theorem6_bounds(X, weights, target, eps, opts))
    except ValueError as exc:  # zero-variance LayerNorm rows (Assumption 2) and the like
        for key in BLOCK_KEYS:
            blocks[f"{name}.{ENGINE_NAME[key]}"] = _not_applicable(str(exc))
        layer_rec["reasons"] = [*layer_rec["reasons"], str(exc)]
        return _LayerResult(layer_rec, blocks, off)
    corrections = per_sample[0]["corrections"]
    layer_rec["ingredients"] = {
        k: max(p["ingredients"][k] for p in per_sample) for k in per_sample[0]["ingredients"]
    }
    layer_rec["H_tr"] = {k: max(p["H_tr"][k] for p in per_sample) for k in per_sample[0]["H_tr"]}
    layer_rec["corrections"] = corrections
    loss_ok = not loss
    reason = None if loss_ok else "; ".join(loss)
    if loss_ok:
        layer_rec["applicable"] = True
        layer_rec["M_tr"] = max(p["M_tr"] for p in per_sample)
        layer_rec["M_tr_mean"] = sum(p["M_tr"] for p in per_sample) / n
        layer_rec["M_SA"] = max(p["M_SA"] for p in per_sample)
    for a, i in enumerate(BLOCK_KEYS):
        for j in BLOCK_KEYS[a:]:
            values = [p["blocks"][i + j]["value"] for p in per_sample] if loss_ok else [0.0]
            rec: BlockBound = {
                "value": sum(values) / n if loss_ok else None,
                "max_over_samples": max(values) if loss_ok else None,
                "formula": _formula(i, j),
                "corrections": corrections,
                "applicable": loss_ok,
                "reason": reason,
                "paper_blocks": [PAPER_NAME[i], PAPER_NAME[j]],
            }
            if i == j:
                blocks[f"{name}.{ENGINE_NAME[i]}"] = rec
            else:
                off.append(
                    {"row": f"{name}.{ENGINE_NAME[i]}", "col": f"{name}.{ENGINE_NAME[j]}", **rec}
                )
    return _LayerResult(layer_rec, blocks, off)


def _not_applicable(reason: str) -> BlockBound:
    return {
        "value": None,
        "max_over_samples": None,
        "formula": None,
        "corrections": [],
        "applicable": False,
        "reason": reason,
    }


def pair_bound(bounds: ModelBounds, a: str, b: str) -> BlockBound | None:
    """The bound record of the block pair (a, b) in either order (||H_ab|| = ||H_ba||):
    ``bounds["blocks"][a]`` for a == b, else the matching ``off_diagonal`` entry."""
    if a == b:
        return bounds.get("blocks", {}).get(a)
    for entry in bounds.get("off_diagonal", []):
        if {entry["row"], entry["col"]} == {a, b}:
            return entry
    return None


def tightness(bounds: ModelBounds, measured: Mapping[str, float]) -> dict[str, float | None]:
    """bound / measured per block name (None where either is missing or measured is 0)."""
    out: dict[str, float | None] = {}
    for block, rec in bounds.get("blocks", {}).items():
        value, m = rec.get("value"), measured.get(block)
        out[block] = value / m if (value is not None and m) else None
    return out
