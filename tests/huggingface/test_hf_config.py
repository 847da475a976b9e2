"""The contract's Hugging Face config checks and parameter counts against ``transformers``.

The oracle is the model ``transformers`` itself builds from the same ``config.json`` dict (on
the meta device: no memory, so the full-size defaults are checked too).
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from curvplan.types.huggingface import (
    SUPPORTED_ARCHITECTURES,
    HFConfigError,
    HuggingFaceModel,
    parameter_count,
    parse_hf_config,
)

CONFIGS: list[dict[str, Any]] = [
    # Every default of the config class (the full-size models: GPT-2 small, Llama-7B, …).
    {"model_type": "gpt2"},
    {"model_type": "llama"},
    {"model_type": "mistral"},
    {"model_type": "qwen2"},
    # Tiny ones, with the options that change the parameter set.
    {
        "model_type": "gpt2",
        "vocab_size": 37,
        "n_positions": 9,
        "n_embd": 12,
        "n_layer": 2,
        "n_head": 3,
        "n_inner": 20,
        "tie_word_embeddings": False,
    },
    {
        "model_type": "gpt2",
        "vocab_size": 37,
        "max_position_embeddings": 9,
        "hidden_size": 12,
        "num_hidden_layers": 3,
        "num_attention_heads": 2,
    },
    {
        "model_type": "llama",
        "vocab_size": 41,
        "hidden_size": 16,
        "intermediate_size": 24,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "attention_bias": True,
        "mlp_bias": True,
        "tie_word_embeddings": True,
    },
    {
        "model_type": "llama",
        "vocab_size": 41,
        "hidden_size": 16,
        "intermediate_size": 24,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "head_dim": 6,
    },
    {
        "model_type": "mistral",
        "vocab_size": 29,
        "hidden_size": 16,
        "intermediate_size": 20,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "head_dim": 4,
    },
    {
        "model_type": "qwen2",
        "vocab_size": 29,
        "hidden_size": 16,
        "intermediate_size": 20,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
    },
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(f"{v}" for v in c.values()))
def test_parameter_count_equals_the_transformers_model(config: dict[str, Any]) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")

    hf_config = transformers.AutoConfig.for_model(**config)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf_config)
    assert type(model).__name__ == SUPPORTED_ARCHITECTURES[config["model_type"]]
    expected = sum(p.numel() for _, p in model.named_parameters())
    assert parameter_count(config) == expected
    # A saved config.json (with `architectures`) counts the same.
    saved = {**hf_config.to_dict(), "architectures": [type(model).__name__]}
    assert parameter_count(saved) == expected


def test_known_sizes() -> None:
    assert parameter_count({"model_type": "gpt2"}) == 124_439_808  # GPT-2 small
    assert parameter_count({"model_type": "llama"}) == 6_738_415_616  # Llama-7B


class _Body(BaseModel):
    model: HuggingFaceModel


def _errors(config: dict[str, Any]) -> list[tuple[str, str]]:
    with pytest.raises(ValidationError) as info:
        _Body(model={"source": "huggingface", "config": config})
    return [(".".join(map(str, e["loc"])), e["msg"]) for e in info.value.errors()]


def test_refusals_name_the_field_and_list_what_is_supported() -> None:
    supported = "gpt2 (GPT2LMHeadModel), llama (LlamaForCausalLM)"
    [(field, message)] = _errors({"model_type": "bert"})
    assert field == "model.config.model_type"
    assert "'bert'" in message and supported in message
    [(field, message)] = _errors({"model_type": "gpt2", "auto_map": {"AutoModel": "x.Y"}})
    assert field == "model.config.auto_map" and "remote code" in message
    [(field, message)] = _errors({"model_type": "llama", "architectures": ["LlamaModel"]})
    assert field == "model.config.architectures" and "LlamaForCausalLM" in message
    [(field, _)] = _errors({"model_type": "gpt2", "quantization_config": {"bits": 4}})
    assert field == "model.config.quantization_config"
    [(field, message)] = _errors({"vocab_size": 3})
    assert field == "model.config.model_type" and supported in message
    [(field, _)] = _errors({"model_type": "llama", "hidden_size": 0})
    assert field == "model.config.hidden_size"
    [(field, message)] = _errors({"model_type": "gpt2", "n_embd": 10, "n_head": 3})
    assert field == "model.config" and "divisible" in message
    [(_, message)] = _errors(
        {"model_type": "qwen2", "num_attention_heads": 4, "num_key_value_heads": 3}
    )
    assert "multiple" in message
    [(field, _)] = _errors({"model_type": "gpt2", "add_cross_attention": True})
    assert field == "model.config.add_cross_attention"
    # Braces in a refused value are text, not a format template.
    [(_, message)] = _errors({"model_type": "{x}"})
    assert "'{x}'" in message


def test_the_config_is_kept_as_sent() -> None:
    config = {"model_type": "gpt2", "n_embd": 8, "n_head": 2, "custom_field": [1, 2]}
    model = HuggingFaceModel(source="huggingface", config=config)
    assert model.model_dump()["config"] == config
    assert model.architecture == "GPT2LMHeadModel"
    assert model.arch.n_layers == 12
    with pytest.raises(HFConfigError):
        parse_hf_config(["not", "an", "object"])


def test_dataset_layouts() -> None:
    from curvplan.types.artifact_inputs import DatasetLayoutError, dataset_layout

    assert dataset_layout(["inputs", "targets"]) == "reference"
    assert dataset_layout(["input_ids"]) == "huggingface"
    assert dataset_layout(["input_ids", "attention_mask", "labels"]) == "huggingface"
    for names, tensor in [
        (["inputs"], "targets"),
        (["inputs", "targets", "weights"], "weights"),
        (["inputs", "targets", "attention_mask"], "attention_mask"),
        (["labels"], "input_ids"),
        (["input_ids", "token_type_ids"], "token_type_ids"),
        ([], "input_ids"),
    ]:
        with pytest.raises(DatasetLayoutError) as info:
            dataset_layout(names)
        assert info.value.tensor == tensor, names


def test_checkpoint_reference_is_one_id_or_distinct_shards() -> None:
    import uuid

    from pydantic import TypeAdapter

    from curvplan.types.artifact_inputs import CheckpointRef, checkpoint_ids

    adapter = TypeAdapter(CheckpointRef)
    one, two = uuid.uuid4(), uuid.uuid4()
    assert adapter.validate_python(str(one)) == one
    assert adapter.validate_python([str(one), str(two)]) == [one, two]
    assert checkpoint_ids(str(one)) == [one]
    assert checkpoint_ids([one, two]) == [one, two]
    for bad in ([], [str(one), str(one)], "nope"):
        with pytest.raises(ValidationError):
            adapter.validate_python(bad)
