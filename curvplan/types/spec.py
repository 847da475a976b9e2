"""Model specification of the reference Transformer family (engine contract, "Model spec").

A :class:`ModelSpec` is parsed from JSON; :func:`load_spec` reads a file and turns
validation failures into :class:`SpecError` naming every offending field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    StrictBool,
    ValidationError,
    model_validator,
)


class SpecError(ValueError):
    """A model spec that cannot be used; ``errors`` lists ``(field, message)`` pairs."""

    def __init__(self, errors: list[tuple[str, str]]) -> None:
        self.errors = errors
        lines = "; ".join(f"{field}: {msg}" for field, msg in errors)
        super().__init__(f"invalid model spec: {lines}")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CausalLMTask(_Strict):
    """Next-token prediction: inputs and targets (n, seq) int64 tokens (-100 ignored)."""

    type: Literal["causal_lm"] = "causal_lm"
    vocab_size: int = Field(gt=1)
    seq_len: int = Field(gt=0)
    tie_embeddings: StrictBool = False


class ClassificationTask(_Strict):
    """Sequence classification: mean-pool over tokens, linear head, cross-entropy.

    Exactly one of ``input_dim`` (float features (n, seq, input_dim)) and ``vocab_size``
    (tokens (n, seq) int64) is set.
    """

    type: Literal["classification"] = "classification"
    seq_len: int = Field(gt=0)
    input_dim: int | None = Field(default=None, gt=0)
    vocab_size: int | None = Field(default=None, gt=1)
    n_classes: int = Field(gt=1)

    @model_validator(mode="after")
    def _one_input_kind(self) -> ClassificationTask:
        if (self.input_dim is None) == (self.vocab_size is None):
            raise ValueError("set exactly one of input_dim and vocab_size")
        return self


class RegressionTask(_Strict):
    """MSE regression on every token (the theory's loss).

    ``input_dim: null`` feeds inputs (n, seq, d_model) directly (no embedding);
    ``output_dim: null`` has no head: targets are (n, seq, d_model) compared with the last
    block's output Z. Loss = mean squared error over all elements.
    """

    type: Literal["regression"] = "regression"
    seq_len: int = Field(gt=0)
    input_dim: int | None = Field(default=None, gt=0)
    output_dim: int | None = Field(default=None, gt=0)


TaskSpec = Annotated[
    CausalLMTask | ClassificationTask | RegressionTask, Field(discriminator="type")
]


class ModelSpec(_Strict):
    """Reference Transformer: ``n_layers`` blocks of (multi-head) self-attention and an FFN.

    ``norm_position="post"`` is the paper's block (Petrov et al. 2025, eq. "transformer"):
    Y = Norm(X + F(X)), Z = Norm(Y + FFN(Y)). ``"pre"`` is the GPT-2 arrangement.
    """

    d_model: int = Field(gt=0)
    n_heads: int = Field(gt=0)
    d_ff: int = Field(gt=0)
    n_layers: int = Field(ge=0)
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    norm_position: Literal["post", "pre"] = "post"
    ln_eps: float = Field(default=1e-5, ge=0.0)
    norm_affine: StrictBool = True
    activation: Literal["relu", "gelu"] = "gelu"
    bias: StrictBool = True
    attn_output_proj: StrictBool = True
    final_norm: StrictBool | None = None
    positional: Literal["learned", "sinusoidal", "none"] = "learned"
    task: TaskSpec

    @model_validator(mode="after")
    def _consistent(self) -> ModelSpec:
        if self.d_model % self.n_heads != 0:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})"
            )
        if self.final_norm is None:
            object.__setattr__(self, "final_norm", self.norm_position == "pre")
        return self

    @property
    def use_final_norm(self) -> bool:
        """Whether a final norm follows the last block (resolved default)."""
        return bool(self.final_norm)

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    @property
    def has_embedding(self) -> bool:
        task = self.task
        if isinstance(task, CausalLMTask):
            return True
        return not (isinstance(task, RegressionTask) and task.input_dim is None)

    def parameter_count(self) -> int:
        """Elements of the reference model's parameters (``CurvTransformer(spec)``), a tied
        head counted once: what a checkpoint of this spec holds and the engine allocates."""
        d, bias = self.d_model, int(self.bias)

        def linear(n_in: int, n_out: int) -> int:
            return n_in * n_out + bias * n_out

        norm = 0
        if self.norm_affine:
            norm = d + (d if self.norm == "layernorm" and self.bias else 0)
        attention = 3 * linear(d, d) + (linear(d, d) if self.attn_output_proj else 0)
        block = 2 * norm + attention + linear(d, self.d_ff) + linear(self.d_ff, d)
        total = self.n_layers * block + (norm if self.use_final_norm else 0)
        task = self.task
        if isinstance(task, CausalLMTask) or (
            isinstance(task, ClassificationTask) and task.vocab_size is not None
        ):
            total += (task.vocab_size or 0) * d
        elif not isinstance(task, CausalLMTask) and task.input_dim is not None:
            total += linear(task.input_dim, d)
        if self.positional == "learned":
            total += task.seq_len * d
        if isinstance(task, CausalLMTask):
            total += bias * task.vocab_size + (0 if task.tie_embeddings else d * task.vocab_size)
        elif isinstance(task, ClassificationTask):
            total += linear(d, task.n_classes)
        elif task.output_dim is not None:
            total += linear(d, task.output_dim)
        return total

    @property
    def token_inputs(self) -> bool:
        """Whether the inputs are int64 token ids (else float features)."""
        task = self.task
        return isinstance(task, CausalLMTask) or (
            isinstance(task, ClassificationTask) and task.vocab_size is not None
        )


def _pydantic_errors(exc: ValidationError) -> list[tuple[str, str]]:
    out = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "<spec>"
        out.append((loc, err["msg"]))
    return out


def parse_spec(data: dict[str, JsonValue] | ModelSpec) -> ModelSpec:
    """Validate a spec given as JSON (a request's or a spec file's object); raise
    :class:`SpecError` naming each invalid field. A ``ModelSpec`` is returned as is."""
    if isinstance(data, ModelSpec):
        return data
    try:
        return ModelSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(_pydantic_errors(exc)) from None


def load_spec(path: str | Path) -> ModelSpec:
    """Read a JSON spec file; raise :class:`SpecError` on unreadable JSON or invalid fields."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SpecError([(str(path), f"cannot read JSON: {exc}")]) from None
    if not isinstance(data, dict):
        raise SpecError([(str(path), "the spec must be a JSON object")])
    return parse_spec(data)
