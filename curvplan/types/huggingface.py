"""Hugging Face model sources of the contract: ``{"source": "huggingface", "config": {...}}``.

Torch- and transformers-free: the API validates a ``config.json`` with these models before a
job is queued, the worker builds the model from the very same dict (offline, eager attention).

What is checked here, with the failing field named:

- ``auto_map`` (remote code) and ``quantization_config`` are refused: the worker runs only the
  architectures built into ``transformers``, in full precision;
- ``model_type`` and ``architectures`` must name a supported causal LM
  (:data:`SUPPORTED_ARCHITECTURES`); anything else is refused with the supported list;
- the sizes the parameter count depends on are positive integers and consistent (heads divide
  the width, key/value heads divide the heads);
- :func:`parameter_count` gives the number of ``named_parameters()`` elements the worker's
  model will have (tied embeddings counted once), so a service can refuse models above a
  configurable size before any GPU is involved.

Missing fields take the defaults of the ``transformers`` config class of that ``model_type``
(``GPT2Config``, ``LlamaConfig``, ``MistralConfig``, ``Qwen2Config``), as ``from_pretrained``
does; GPT-2's aliases (``hidden_size`` for ``n_embd``, …) are accepted like its
``attribute_map`` accepts them.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    ValidationError,
    field_validator,
    model_validator,
)

SUPPORTED_ARCHITECTURES: dict[str, str] = {
    "gpt2": "GPT2LMHeadModel",
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
}
"""``model_type`` → the one causal-LM architecture the worker builds for it."""

REFUSED_KEYS: dict[str, str] = {
    "auto_map": "remote code is never run: configs with auto_map (trust_remote_code models) "
    "are refused; use a built-in architecture",
    "quantization_config": "quantized models are not analysed: curvature is measured in full "
    "precision; send the unquantized weights",
}
"""Config keys that make a model unusable here, with the reason."""

PositiveInt = Annotated[int, Field(gt=0, strict=True)]


def supported_text() -> str:
    """``gpt2 (GPT2LMHeadModel), llama (LlamaForCausalLM), …`` for error messages."""
    return ", ".join(f"{t} ({a})" for t, a in SUPPORTED_ARCHITECTURES.items())


class _ArchConfig(BaseModel):
    """The fields of one architecture's config.json that shape its parameters."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    architectures: list[str] | None = None
    tie_word_embeddings: bool = False

    @field_validator("architectures")
    @classmethod
    def _one_supported(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return value
        wanted = SUPPORTED_ARCHITECTURES[cls.model_type_name()]
        if value != [wanted]:
            raise ValueError(
                f"architectures {value} is not supported for model_type "
                f"{cls.model_type_name()!r}: it must be [{wanted!r}] (causal language models "
                f"only); supported: {supported_text()}"
            )
        return value

    @classmethod
    def model_type_name(cls) -> str:
        raise NotImplementedError

    def parameter_count(self) -> int:
        raise NotImplementedError

    @property
    def n_layers(self) -> int:
        raise NotImplementedError


class GPT2Config(_ArchConfig):
    """``GPT2LMHeadModel``: learned positions, LayerNorm, fused q/k/v (``Conv1D``), GELU MLP."""

    model_type: Literal["gpt2"] = "gpt2"
    vocab_size: PositiveInt = 50257
    n_positions: PositiveInt = Field(
        default=1024, validation_alias=AliasChoices("n_positions", "max_position_embeddings")
    )
    n_embd: PositiveInt = Field(default=768, validation_alias=AliasChoices("n_embd", "hidden_size"))
    n_layer: PositiveInt = Field(
        default=12, validation_alias=AliasChoices("n_layer", "num_hidden_layers")
    )
    n_head: PositiveInt = Field(
        default=12, validation_alias=AliasChoices("n_head", "num_attention_heads")
    )
    n_inner: PositiveInt | None = None
    add_cross_attention: bool = False
    tie_word_embeddings: bool = True

    @classmethod
    def model_type_name(cls) -> str:
        return "gpt2"

    @field_validator("add_cross_attention")
    @classmethod
    def _decoder_only(cls, value: bool) -> bool:
        if value:
            raise ValueError("cross-attention (an encoder-decoder GPT-2) is not supported")
        return value

    @model_validator(mode="after")
    def _heads_divide(self) -> GPT2Config:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        return self

    @property
    def n_layers(self) -> int:
        return self.n_layer

    def parameter_count(self) -> int:
        """Elements of ``GPT2LMHeadModel(config).named_parameters()`` (tied ``lm_head`` once)."""
        d, inner = self.n_embd, self.n_inner or 4 * self.n_embd
        layer = (
            2 * d  # ln_1
            + d * 3 * d
            + 3 * d  # attn.c_attn (Conv1D, fused q/k/v)
            + d * d
            + d  # attn.c_proj
            + 2 * d  # ln_2
            + d * inner
            + inner  # mlp.c_fc
            + inner * d
            + d  # mlp.c_proj
        )
        total = self.vocab_size * d + self.n_positions * d + self.n_layer * layer + 2 * d
        return total + (0 if self.tie_word_embeddings else self.vocab_size * d)


class _LlamaFamilyConfig(_ArchConfig):
    """Llama and relatives: RMSNorm, rotary positions, grouped-query attention, SwiGLU MLP."""

    vocab_size: PositiveInt
    hidden_size: PositiveInt
    intermediate_size: PositiveInt
    num_hidden_layers: PositiveInt = 32
    num_attention_heads: PositiveInt = 32
    num_key_value_heads: PositiveInt | None = None
    head_dim: PositiveInt | None = None

    def _q_k_v_o_bias(self) -> tuple[bool, bool]:
        """Whether q/k/v and o carry a bias."""
        return False, False

    def _mlp_bias(self) -> bool:
        return False

    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def n_layers(self) -> int:
        return self.num_hidden_layers

    @model_validator(mode="after")
    def _heads_divide(self) -> _LlamaFamilyConfig:
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_attention_heads "
                f"({self.num_attention_heads}) when head_dim is not given"
            )
        if self.num_attention_heads % self.kv_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.kv_heads})"
            )
        return self

    def parameter_count(self) -> int:
        """Elements of ``*ForCausalLM(config).named_parameters()`` (tied ``lm_head`` once)."""
        h, inner, hd = self.hidden_size, self.intermediate_size, self.resolved_head_dim
        q, kv = self.num_attention_heads * hd, self.kv_heads * hd
        qkv_bias, o_bias = self._q_k_v_o_bias()
        mlp_bias = self._mlp_bias()
        layer = (
            2 * h  # input_layernorm, post_attention_layernorm (RMSNorm: weight only)
            + h * q
            + 2 * h * kv  # q_proj, k_proj, v_proj
            + q * h  # o_proj
            + 3 * h * inner  # gate_proj, up_proj, down_proj
        )
        if qkv_bias:
            layer += q + 2 * kv
        if o_bias:
            layer += h
        if mlp_bias:
            layer += 2 * inner + h
        total = self.vocab_size * h + self.num_hidden_layers * layer + h  # embed, layers, norm
        return total + (0 if self.tie_word_embeddings else self.vocab_size * h)


class LlamaConfig(_LlamaFamilyConfig):
    """``LlamaForCausalLM`` (``attention_bias`` and ``mlp_bias`` optional)."""

    model_type: Literal["llama"] = "llama"
    vocab_size: PositiveInt = 32000
    hidden_size: PositiveInt = 4096
    intermediate_size: PositiveInt = 11008
    attention_bias: bool = False
    mlp_bias: bool = False

    @classmethod
    def model_type_name(cls) -> str:
        return "llama"

    def _q_k_v_o_bias(self) -> tuple[bool, bool]:
        return self.attention_bias, self.attention_bias

    def _mlp_bias(self) -> bool:
        return self.mlp_bias


class MistralConfig(_LlamaFamilyConfig):
    """``MistralForCausalLM``: Llama's modules without biases (8 key/value heads by default)."""

    model_type: Literal["mistral"] = "mistral"
    vocab_size: PositiveInt = 32000
    hidden_size: PositiveInt = 4096
    intermediate_size: PositiveInt = 14336
    num_key_value_heads: PositiveInt | None = 8

    @classmethod
    def model_type_name(cls) -> str:
        return "mistral"


class Qwen2Config(_LlamaFamilyConfig):
    """``Qwen2ForCausalLM``: Llama's modules with biases on q, k and v."""

    model_type: Literal["qwen2"] = "qwen2"
    vocab_size: PositiveInt = 151936
    hidden_size: PositiveInt = 4096
    intermediate_size: PositiveInt = 22016
    num_key_value_heads: PositiveInt | None = 32

    @classmethod
    def model_type_name(cls) -> str:
        return "qwen2"

    def _q_k_v_o_bias(self) -> tuple[bool, bool]:
        return True, False


ArchConfig = GPT2Config | LlamaConfig | MistralConfig | Qwen2Config
_CONFIG_CLASSES: dict[str, type[_ArchConfig]] = {
    "gpt2": GPT2Config,
    "llama": LlamaConfig,
    "mistral": MistralConfig,
    "qwen2": Qwen2Config,
}


class HFConfigError(ValueError):
    """A config.json the service refuses; ``errors`` lists ``(loc, message)`` pairs."""

    def __init__(self, errors: list[tuple[tuple[str | int, ...], str]]) -> None:
        self.errors = errors
        text = "; ".join(f"{'.'.join(str(p) for p in loc) or 'config'}: {m}" for loc, m in errors)
        super().__init__(text)


def parse_hf_config(config: Any) -> ArchConfig:
    """The typed view of a ``config.json`` dict; :class:`HFConfigError` naming each field.

    Refuses remote code and quantization, unknown ``model_type``/``architectures``, and sizes
    that no model of that type could have (see the module docstring).
    """
    if not isinstance(config, dict):
        raise HFConfigError([((), "the config must be a JSON object (the config.json content)")])
    errors: list[tuple[tuple[str | int, ...], str]] = [
        ((key,), reason) for key, reason in REFUSED_KEYS.items() if config.get(key) is not None
    ]
    model_type = config.get("model_type")
    if model_type is None:
        errors.append(
            (("model_type",), f"required (the model's type); supported: {supported_text()}")
        )
    elif model_type not in _CONFIG_CLASSES:
        errors.append(
            (
                ("model_type",),
                f"model_type {model_type!r} is not supported; supported: {supported_text()}",
            )
        )
    if errors:
        raise HFConfigError(errors)
    try:
        return _CONFIG_CLASSES[str(model_type)].model_validate(config)  # type: ignore[return-value]
    except ValidationError as exc:
        raise HFConfigError(
            [(tuple(e["loc"]), str(e["msg"]).removeprefix("Value error, ")) for e in exc.errors()]
        ) from None


def parameter_count(config: dict[str, JsonValue] | ArchConfig) -> int:
    """Number of parameter elements of the model the worker builds from ``config``."""
    parsed = config if isinstance(config, _ArchConfig) else parse_hf_config(config)
    return parsed.parameter_count()


def _check_finite(value: Any, loc: tuple[str | int, ...]) -> None:
    """Refuse NaN and ±Infinity anywhere in a config (JSON has no such numbers; Python's
    parser accepts them, PostgreSQL's jsonb stores them as null, and the worker then fails)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise HFConfigError([(loc, f"{value} is not a JSON number; a config holds finite ones")])
    if isinstance(value, dict):
        for key, item in value.items():
            _check_finite(item, (*loc, str(key)))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_finite(item, (*loc, i))


class HuggingFaceModel(BaseModel):
    """A model given by its Hugging Face ``config.json`` (weights: the checkpoint artifacts).

    ``config`` is kept exactly as sent (the worker builds from it); it is validated with
    :func:`parse_hf_config`, so a refused config is a 422 naming ``model.config.<key>``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: Literal["huggingface"] = Field(description="Where the model comes from.")
    # Arbitrary JSON on purpose: the config.json is kept exactly as sent and passed through to
    # transformers; parse_hf_config reads the keys the engine needs (and refuses the rest).
    config: dict[str, JsonValue] = Field(
        description="The content of the save_pretrained directory's config.json. Supported "
        "model_type (architecture): " + supported_text() + "."
    )

    @field_validator("config")
    @classmethod
    def _supported(cls, value: dict[str, JsonValue]) -> dict[str, JsonValue]:
        try:
            _check_finite(value, ())
            parse_hf_config(value)
        except HFConfigError as exc:
            from pydantic_core import InitErrorDetails, PydanticCustomError

            details: list[InitErrorDetails] = [
                {
                    "type": PydanticCustomError("hf_config", message),
                    "loc": loc,
                    "input": value.get(loc[0]) if loc and isinstance(loc[0], str) else value,
                }
                for loc, message in exc.errors
            ]
            raise ValidationError.from_exception_data(cls.__name__, details) from None
        return value

    @property
    def arch(self) -> ArchConfig:
        """The typed view of :attr:`config`."""
        return parse_hf_config(self.config)

    @property
    def model_type(self) -> str:
        return str(self.config["model_type"])

    @property
    def architecture(self) -> str:
        return SUPPORTED_ARCHITECTURES[self.model_type]

    def parameter_count(self) -> int:
        return self.arch.parameter_count()
