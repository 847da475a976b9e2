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


HF_OPTIONS: dict[str, Any] = {
    # Cheap on a shared 2-core machine: a tiny model in float64, few iterations and probes.
    "precision": "float64",
    "seed": 3,
    "dense": "off",
    "tolerance": 1e-6,
    "max_iter": 40,
    "trace_probes": 3,
    "off_diagonal": [["layers.0.q", "layers.0.k"]],
    "hessian_subsample": 2,
    "per_sample_max_iter": 15,
    "n_directions": 2,
    "perturbation_radius": 0.05,
    "gradient_noise": False,
}
N_EXAMPLES = 10
SEQ = 6


def write_hf_datasets(out: Path) -> dict[str, Path]:
    """Token data in the Hugging Face layout: ``input_ids`` + ``attention_mask`` (right padding
    on two rows) and ``input_ids`` + ``labels`` (unshifted, ``-100`` on the first tokens)."""
    import torch
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 13, (N_EXAMPLES, SEQ), generator=gen)
    mask = torch.ones_like(ids)
    mask[0, -2:] = 0
    mask[1, -1:] = 0
    labels = ids.clone()
    labels[:, :2] = -100
    out.mkdir(parents=True, exist_ok=True)
    paths = {"masked": out / "masked.safetensors", "labelled": out / "labelled.safetensors"}
    save_file({"input_ids": ids, "attention_mask": mask}, str(paths["masked"]))
    save_file({"input_ids": ids, "labels": labels}, str(paths["labelled"]))
    return paths
