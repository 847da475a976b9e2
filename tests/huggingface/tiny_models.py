"""Tiny Hugging Face checkpoints written with ``transformers``' own ``save_pretrained``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

GPT2_CONFIG: dict[str, Any] = {
    "model_type": "gpt2",
    "vocab_size": 13,
    "n_positions": 8,
    "n_embd": 8,
    "n_layer": 1,
    "n_head": 2,
    "bos_token_id": 0,
    "eos_token_id": 0,
}
LLAMA_CONFIG: dict[str, Any] = {
    "model_type": "llama",
    "vocab_size": 13,
    "hidden_size": 8,
    "intermediate_size": 12,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 8,
    "bos_token_id": 0,
    "eos_token_id": 0,
}


def save_tiny(
    config: dict[str, Any], out: Path, *, seed: int = 0, max_shard_size: str | None = None
) -> Path:
    """``AutoModelForCausalLM.from_config(config)`` saved to ``out`` (sharded when asked)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.for_model(**config)
    )
    kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(out, **kwargs)
    return out
