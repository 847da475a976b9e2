"""Hugging Face causal language models as a model source of the curvature engine.

A model source is a ``config.json`` dict (``{"source": "huggingface", "config": {...}}`` in a
request) plus the safetensors shards written by ``save_pretrained``. The engine builds the
model from the config only (offline, no remote code, ``attn_implementation="eager"`` so that
attention is an explicit matmul-softmax with second derivatives), loads the shards the way
``from_pretrained`` accepts them, and differentiates a cross-entropy it computes itself from
the logits in the model's dtype (the model's own ``labels=`` loss upcasts the logits to float32,
which caps the accuracy of every second-order product at float32 even in a float64 run).

The built module keeps the model's own ``named_parameters()`` names (they are what checkpoints,
blocks and reports use); its ``forward`` takes one packed int64 tensor ``(n, 2, T)`` — input ids
and attention mask — and returns the logits, so that the engine's products, which call
``model(inputs)`` through ``torch.func.functional_call``, treat it like the reference model.
Position ids follow the mask (``cumsum(mask) − 1``), so left padding does not shift positions.

See ``docs/engine-model-sources.md`` for the entry points and the data conventions.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import torch
from torch import Tensor, nn

from curvplan.types.huggingface import SUPPORTED_ARCHITECTURES
from curvplan_core import blocks as core_blocks
from curvplan_worker.curvature.checkpoint import (
    CheckpointError,
    CheckpointMismatch,
    TensorIssue,
    non_finite_issue,
    read_safetensors,
)
from curvplan_worker.curvature.objective import IGNORE_INDEX

if TYPE_CHECKING:
    from pydantic import JsonValue
    from transformers import PretrainedConfig

FLOAT32_INTERNALS = {
    "llama": "LlamaRMSNorm and the rotary embedding compute in float32 inside the model",
    "mistral": "MistralRMSNorm and the rotary embedding compute in float32 inside the model",
    "qwen2": "Qwen2RMSNorm and the rotary embedding compute in float32 inside the model",
}
"""Architectures whose float64 runs are limited by float32 arithmetic inside transformers."""

FLOAT32_INTERNALS_ACCURACY = 1e-3
"""Relative accuracy of float64 second-order products reachable on those architectures
(measured: ~8e-4 against Richardson-extrapolated finite differences on tiny configs)."""

_IGNORED_UNEXPECTED = (
    r"(^|\.)attn\.bias$",  # GPT-2's causal-mask buffer in older checkpoints
    r"(^|\.)attn\.masked_bias$",
    r"(^|\.)crossattention\.bias$",
    r"(^|\.)crossattention\.masked_bias$",
    r"(^|\.)rotary_emb\.inv_freq$",  # a buffer, recomputed from the config
)


class HFModelError(ValueError):
    """The config cannot be built offline by the engine; the message names the field."""


# ---------------------------------------------------------------------------------------------
# Building
# ---------------------------------------------------------------------------------------------


def check_config(config: Mapping[str, Any]) -> tuple[str, str]:
    """(model_type, architecture) of a supported config; raises :class:`HFModelError`.

    Refuses remote code (``auto_map``) and every ``model_type``/``architectures`` entry that is
    not in :data:`SUPPORTED_ARCHITECTURES`.
    """
    if not isinstance(config, Mapping):
        raise HFModelError("model.config: expected the config.json object")
    if "auto_map" in config:
        raise HFModelError("model.config.auto_map: remote code is not supported")
    model_type = config.get("model_type")
    supported = ", ".join(f"{t} ({a})" for t, a in SUPPORTED_ARCHITECTURES.items())
    if model_type not in SUPPORTED_ARCHITECTURES:
        raise HFModelError(
            f"model.config.model_type: {model_type!r} is not supported; supported: {supported}"
        )
    arch = SUPPORTED_ARCHITECTURES[model_type]
    archs = config.get("architectures") or [arch]
    if list(archs) != [arch]:
        raise HFModelError(
            f"model.config.architectures: {list(archs)} is not supported for {model_type!r}; "
            f"the engine builds {arch} (supported: {supported})"
        )
    return model_type, arch


def _config_object(config: Mapping[str, Any]) -> PretrainedConfig:
    from transformers import AutoConfig

    model_type, _ = check_config(config)
    fields = {k: v for k, v in config.items() if k not in ("model_type", "_name_or_path")}
    fields.pop("transformers_version", None)
    try:
        cfg = AutoConfig.for_model(model_type, **fields)
    except (TypeError, ValueError, KeyError) as exc:
        raise HFModelError(f"model.config: {exc}") from None
    cfg._attn_implementation = "eager"
    return cfg


def _packed_forward(self: nn.Module, packed: Tensor) -> Tensor:
    """Logits of ``(n, 2, T)`` packed (input ids, attention mask); positions follow the mask."""
    ids, mask = packed[:, 0], packed[:, 1]
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    out = (
        type(self)
        .__mro__[1]
        .forward(
            self,
            input_ids=ids,
            attention_mask=_additive_mask(mask, self.dtype),
            position_ids=positions,
            use_cache=False,
            return_dict=True,
        )
    )
    logits: Tensor = out.logits
    return logits


def _additive_mask(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """The (n, 1, T, T) additive attention mask: causal, padded keys hidden from real queries,
    and every padded query attending to itself only — so that no row is entirely masked (an
    all-masked row is a uniform average in floating point, not the smooth function autograd
    differentiates, and in float64 models that upcast the softmax to float32 it is NaN). Real
    positions see exactly the tokens the usual causal + padding mask shows them."""
    t = mask.shape[-1]
    causal = torch.ones(t, t, dtype=torch.bool, device=mask.device).tril()
    eye = torch.eye(t, dtype=torch.bool, device=mask.device)
    allowed = causal & (mask.bool()[:, None, None, :] | eye)
    zero = torch.zeros((), dtype=dtype, device=mask.device)
    return torch.where(allowed, zero, torch.finfo(dtype).min)


_PACKED_CLASSES: dict[type, type] = {}


def _packed_class(cls: type) -> type:
    if cls not in _PACKED_CLASSES:
        _PACKED_CLASSES[cls] = type(
            f"Curvplan{cls.__name__}",
            (cls,),
            {"forward": _packed_forward, "__module__": __name__},
        )
    return _PACKED_CLASSES[cls]


class PrecisionLimit(TypedDict):
    """Whether a run's products reach its dtype's accuracy (a model computing parts in float32
    does not reach float64's), why not, and the relative accuracy they reach instead (the
    result's ``precision_limited``)."""

    limited: bool
    reason: str | None
    reachable_relative_accuracy: float | None


@dataclass
class HFModel:
    """A built model source: the module and what the engine reports about it."""

    module: nn.Module
    model_type: str
    architecture: str
    config: dict[str, JsonValue]  # the config.json object as given
    tied_embeddings: bool
    vocab_size: int
    max_positions: int
    loaded_from: list[str] = field(default_factory=list)

    @property
    def precision_note(self) -> str | None:
        return FLOAT32_INTERNALS.get(self.model_type)

    def precision_limited(self, dtype: torch.dtype) -> PrecisionLimit:
        """``{limited, reason, reachable_relative_accuracy}`` for a run in ``dtype``."""
        note = self.precision_note
        if note is None or dtype != torch.float64:
            return {"limited": False, "reason": None, "reachable_relative_accuracy": None}
        return {
            "limited": True,
            "reason": f"{note}: float64 products are accurate to about "
            f"{FLOAT32_INTERNALS_ACCURACY:g} relative, not to float64 rounding",
            "reachable_relative_accuracy": FLOAT32_INTERNALS_ACCURACY,
        }


def build_hf_model(
    config: Mapping[str, Any], *, dtype: torch.dtype = torch.float32, seed: int = 0
) -> HFModel:
    """Build the causal LM of ``config`` (a ``config.json`` dict), offline, eager attention,
    randomly initialised from ``seed`` (the global RNG is restored), in eval mode."""
    import transformers

    model_type, arch = check_config(config)
    cfg = _config_object(config)
    cls = getattr(transformers, arch)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            module = cls(cfg)
        except (TypeError, ValueError, AttributeError, RuntimeError) as exc:
            raise HFModelError(f"model.config: cannot build {arch}: {exc}") from None
    module.__class__ = _packed_class(cls)
    module.to(dtype)
    module.eval()
    tied = bool(getattr(cfg, "tie_word_embeddings", False))
    max_positions = int(
        getattr(cfg, "n_positions", None) or getattr(cfg, "max_position_embeddings", 0) or 0
    )
    return HFModel(
        module=module,
        model_type=model_type,
        architecture=arch,
        config=dict(config),
        tied_embeddings=tied and "lm_head.weight" not in dict(module.named_parameters()),
        vocab_size=int(cfg.vocab_size),
        max_positions=max_positions,
    )


def count_parameters(config: Mapping[str, Any]) -> int:
    """Parameters of the model a config builds (tied tensors once), without allocating it."""
    cfg = _config_object(config)
    import transformers

    cls = getattr(transformers, SUPPORTED_ARCHITECTURES[check_config(config)[0]])
    with torch.device("meta"):
        module = cls(cfg)
    return sum(p.numel() for p in module.parameters())


# ---------------------------------------------------------------------------------------------
# Loading weights
# ---------------------------------------------------------------------------------------------


def _shard_label(paths: Sequence[str | Path]) -> str:
    names = [Path(p).name for p in paths]
    return names[0] if len(names) == 1 else f"{len(names)} shards ({', '.join(names)})"


def read_shards(paths: Sequence[str | Path]) -> dict[str, Tensor]:
    """Every tensor of the safetensors shards; a name in two shards is an error."""
    if isinstance(paths, str | Path):
        paths = [paths]
    if not paths:
        raise CheckpointError("checkpoint: no safetensors shard given")
    state: dict[str, Tensor] = {}
    for path in paths:
        for name, tensor in read_safetensors(path, "checkpoint").items():
            if name in state:
                raise CheckpointError(f"checkpoint: tensor {name!r} is in more than one shard")
            state[name] = tensor
    return state


def map_checkpoint_names(
    module: nn.Module, names: Sequence[str]
) -> tuple[dict[str, str], list[str], list[str]]:
    """Map checkpoint names onto the model's parameter names as ``from_pretrained`` does.

    Accepts the names with or without the base-model prefix (``transformer.``/``model.``),
    ignores known buffers (GPT-2's ``attn.bias``, rotary ``inv_freq``) and a tied ``lm_head``.
    Returns ({checkpoint name: parameter name}, ignored names, unexpected names).
    """
    expected = dict(module.named_parameters())
    prefix = getattr(module, "base_model_prefix", "") or ""
    tied_targets = set((getattr(module, "_tied_weights_keys", None) or {}) or {})
    if isinstance(getattr(module, "_tied_weights_keys", None), list | tuple):
        tied_targets = set(module._tied_weights_keys)
    mapping: dict[str, str] = {}
    ignored: list[str] = []
    unexpected: list[str] = []
    for name in names:
        candidates = [name]
        if prefix:
            candidates.append(f"{prefix}.{name}")
            if name.startswith(prefix + "."):
                candidates.append(name[len(prefix) + 1 :])
        hit = next((c for c in candidates if c in expected), None)
        if hit is not None:
            mapping[name] = hit
        elif _ignorable(name, candidates, tied_targets):
            ignored.append(name)
        else:
            unexpected.append(name)
    return mapping, ignored, unexpected


def _ignorable(name: str, candidates: list[str], tied_targets: set[str]) -> bool:
    if name.endswith("lm_head.weight") and any(c in tied_targets for c in candidates):
        return True  # a tied head saved anyway: the embedding is the tensor
    # known buffers only, matched exactly (the models' own ignore patterns are looser regexes:
    # "attn.bias" would also hide a misplaced "c_attn.bias")
    return any(re.search(p, name) for p in _IGNORED_UNEXPECTED)


def load_hf_weights(model: HFModel | nn.Module, shards: Sequence[str | Path]) -> list[str]:
    """Load safetensors shards into the model after strict checks; returns the ignored names.

    Raises one :class:`CheckpointMismatch` naming every missing, unexpected, mis-shaped and
    non-float tensor (after the prefix/buffer/tied-head rules of :func:`map_checkpoint_names`).
    """
    module = model.module if isinstance(model, HFModel) else model
    if isinstance(shards, str | Path):
        shards = [shards]
    state = read_shards(shards)
    expected = dict(module.named_parameters())
    mapping, ignored, unexpected = map_checkpoint_names(module, list(state))
    issues: list[TensorIssue] = []
    seen: dict[str, str] = {}
    for ck_name, param_name in mapping.items():
        if param_name in seen:
            issues.append(
                TensorIssue(ck_name, "unexpected", None, f"duplicate of {seen[param_name]!r}")
            )
            continue
        seen[param_name] = ck_name
        tensor, param = state[ck_name], expected[param_name]
        if tuple(tensor.shape) != tuple(param.shape):
            issues.append(
                TensorIssue(ck_name, "shape", str(tuple(param.shape)), str(tuple(tensor.shape)))
            )
        if not tensor.is_floating_point():
            issues.append(TensorIssue(ck_name, "dtype", "a floating dtype", str(tensor.dtype)))
        elif (issue := non_finite_issue(ck_name, tensor)) is not None:
            issues.append(issue)
    for name in unexpected:
        issues.append(TensorIssue(name, "unexpected", None, str(tuple(state[name].shape))))
    for name, param in expected.items():
        if name not in seen:
            issues.append(TensorIssue(name, "missing", str(tuple(param.shape)), None))
    if issues:
        raise CheckpointMismatch(_shard_label(shards), issues)
    with torch.no_grad():
        for ck_name, param_name in mapping.items():
            param = expected[param_name]
            param.copy_(state[ck_name].to(param.dtype))
    if isinstance(model, HFModel):
        model.loaded_from = [str(p) for p in shards]
    return ignored


def save_hf_weights(model: HFModel | nn.Module, path: str | Path) -> None:
    """One safetensors file of the model's parameters under ``named_parameters()`` names."""
    from safetensors.torch import save_file

    module = model.module if isinstance(model, HFModel) else model
    save_file({n: p.detach().contiguous().cpu() for n, p in module.named_parameters()}, str(path))


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------


def pack_causal_lm(
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    labels: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Hugging Face conventions → the engine's (inputs, targets).

    ``inputs`` is ``(n, 2, T)`` = (input ids, attention mask); ``targets`` ``(n, T)`` holds at
    position t the label of t+1 (``-100`` = no loss term), i.e. the shift that the models'
    ``labels=`` loss applies. Without ``labels`` the labels are the input ids where the mask is
    1 and ``-100`` elsewhere. A term predicted FROM a padded position (mask 0 at t) is dropped
    too: a padded query attends to no token, its logits are not a prediction (and in floating
    point its masked scores are all equal, so the function there is not the smooth one that
    autograd differentiates). No validation here (see :func:`validate_hf_data`).
    """
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    if labels is None:
        labels = torch.where(attention_mask.bool(), input_ids, torch.full_like(input_ids, -100))
    pad = torch.full_like(labels[:, :1], IGNORE_INDEX)
    targets = torch.cat([labels[:, 1:], pad], dim=1)
    targets = targets.masked_fill(attention_mask == 0, IGNORE_INDEX)
    return torch.stack([input_ids, attention_mask], dim=1), targets


def validate_hf_data(model: HFModel, tensors: Mapping[str, Tensor]) -> tuple[Tensor, Tensor]:
    """Check a dataset artifact for a causal LM and convert it (:func:`pack_causal_lm`).

    Accepts ``{input_ids[, attention_mask][, labels]}`` (labels unshifted) or the engine's
    ``{inputs, targets}`` (targets already shifted). Raises ``DataError`` naming the tensor.
    """
    from curvplan_worker.curvature.data import DataError

    def fail(name: str, msg: str) -> DataError:
        return DataError(f"data tensor {name!r}: {msg}")

    keys = set(tensors)
    if "input_ids" in keys:
        extra = sorted(keys - {"input_ids", "attention_mask", "labels"})
        if extra:
            raise DataError(
                f"data: unexpected tensor(s) {extra}; expected input_ids[, attention_mask]"
                "[, labels]"
            )
        ids = tensors["input_ids"]
        mask = tensors.get("attention_mask")
        labels = tensors.get("labels")
        engine_format = False
    elif {"inputs", "targets"} <= keys:
        extra = sorted(keys - {"inputs", "targets"})
        if extra:
            raise DataError(f"data: unexpected tensor(s) {extra}; expected inputs, targets")
        ids, mask, labels = tensors["inputs"], None, tensors["targets"]
        engine_format = True
    else:
        raise DataError(
            f"data: expected input_ids[, attention_mask][, labels] or inputs and targets; "
            f"found {sorted(keys)}"
        )
    id_name = "inputs" if engine_format else "input_ids"
    if ids.dim() != 2 or ids.shape[0] == 0 or ids.shape[1] == 0:
        raise fail(id_name, f"expected shape (n, T) with n, T ≥ 1, found {tuple(ids.shape)}")
    n, t = ids.shape
    if ids.dtype not in (torch.int64, torch.int32):
        raise fail(id_name, f"expected int64 token ids, found dtype {ids.dtype}")
    ids = ids.long()
    if model.max_positions and t > model.max_positions:
        raise fail(id_name, f"sequence length {t} exceeds the model's {model.max_positions}")
    bad = (ids < 0) | (ids >= model.vocab_size)
    if bool(bad.any()):
        raise fail(id_name, f"values must lie in [0, {model.vocab_size}); found {ids[bad][0]}")
    if mask is not None:
        if tuple(mask.shape) != (n, t):
            raise fail("attention_mask", f"expected shape {(n, t)}, found {tuple(mask.shape)}")
        if mask.is_floating_point() or mask.dtype == torch.bool:
            mask = mask.long()
        mask = mask.long()
        if not bool(((mask == 0) | (mask == 1)).all()):
            raise fail("attention_mask", "values must be 0 or 1")
        if bool((mask.sum(dim=1) == 0).any()):
            raise fail("attention_mask", "a sequence has no attended token")
    label_name = "targets" if engine_format else "labels"
    if labels is not None:
        if tuple(labels.shape) != (n, t):
            raise fail(label_name, f"expected shape {(n, t)}, found {tuple(labels.shape)}")
        if labels.dtype not in (torch.int64, torch.int32):
            raise fail(label_name, f"expected int64 token ids, found dtype {labels.dtype}")
        labels = labels.long()
        ok = ((labels >= 0) & (labels < model.vocab_size)) | (labels == IGNORE_INDEX)
        if not bool(ok.all()):
            raise fail(
                label_name,
                f"values must lie in [0, {model.vocab_size}) or {IGNORE_INDEX}; "
                f"found {labels[~ok][0]}",
            )
    if engine_format:
        packed = torch.stack([ids, torch.ones_like(ids)], dim=1)
        targets = labels
    else:
        packed, targets = pack_causal_lm(ids, mask, labels)
    if not bool((targets != IGNORE_INDEX).any()):
        raise fail(label_name if labels is not None else id_name, "no loss terms (all ignored)")
    assert targets is not None  # labels given, or derived from input_ids by pack_causal_lm
    return packed, targets


# ---------------------------------------------------------------------------------------------
# Blocks
# ---------------------------------------------------------------------------------------------


def uniform_blocks(module: nn.Module, model_type: str) -> dict[str, list[str]]:
    """The engine's uniform block ids over a Hugging Face model's parameters
    (``curvplan_core.blocks.uniform_blocks`` on its ``named_parameters()`` shapes)."""
    shapes = {name: tuple(param.shape) for name, param in module.named_parameters()}
    return core_blocks.uniform_blocks(shapes, model_type)
