"""A tiny Hugging Face GPT-2 or Llama trained offline on the Markov-chain language
(``curvplan example --arch gpt2|llama``).

Writes a ``save_pretrained`` directory (``config.json`` + ``model.safetensors``), the
held-out evaluation sample as Hugging Face tokenized data (``data.safetensors`` with
``input_ids`` and ``attention_mask``; labels are implied: the next tokens), training
sequences of the same language for sweeps (``train.safetensors``, same format) and
``step_<n>.safetensors`` intermediate checkpoints (the model's parameters, the step in the
metadata, for the noise-scale trend), so that ``curvplan curvature --model DIR --data
DIR/data.safetensors``, the service's analyze jobs and its sweeps (``curvplan sweep --model
DIR``) run on a real architecture end to end. The language is the one of ``example.py``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from curvplan_worker.curvature.checkpoint import save_checkpoint
from curvplan_worker.curvature.example import entropy_rate, markov_chain, sample_sequences
from curvplan_worker.curvature.hf import build_hf_model, pack_causal_lm
from curvplan_worker.curvature.objective import CausalLMObjective

VOCAB, SEQ = 16, 32

EXAMPLE_CONFIGS: dict[str, dict] = {
    "gpt2": {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "vocab_size": VOCAB,
        "n_positions": SEQ,
        "n_embd": 32,
        "n_layer": 2,
        "n_head": 2,
        "n_inner": 64,
        "activation_function": "gelu_new",
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "layer_norm_epsilon": 1e-5,
        "tie_word_embeddings": True,
        "bos_token_id": 0,
        "eos_token_id": 0,
    },
    "llama": {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": VOCAB,
        "max_position_embeddings": SEQ,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "bos_token_id": 0,
        "eos_token_id": 0,
    },
}


def write_hf_example(
    out_dir: str | Path,
    arch: str = "gpt2",
    *,
    steps: int = 300,
    batch_size: int = 32,
    n_eval: int = 64,
    seed: int = 0,
    lr: float = 3e-3,
    n_train: int = 4096,
    checkpoint_steps: tuple[int, ...] = (10, 25, 50, 100, 200),
) -> dict:
    """Train the tiny ``arch`` model and write into ``out_dir``: ``config.json`` and
    ``model.safetensors`` (by ``save_pretrained``), ``data.safetensors`` (the held-out
    evaluation sample), ``train.safetensors`` (``n_train`` further sequences of the language,
    from a generator of their own so that the trained model does not depend on ``n_train``)
    and ``step_<n>.safetensors`` at ``checkpoint_steps``. Returns a summary."""
    if arch not in EXAMPLE_CONFIGS:
        raise ValueError(f"arch: expected one of {sorted(EXAMPLE_CONFIGS)}, got {arch!r}")
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = EXAMPLE_CONFIGS[arch]
    gen = torch.Generator().manual_seed(seed)
    trans, pi = markov_chain(VOCAB, gen)
    model = build_hf_model(config, seed=seed)
    module = model.module
    objective = CausalLMObjective()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    module.train()
    opt = torch.optim.Adam(module.parameters(), lr=lr)
    first = last = math.nan
    saved = []
    try:
        for step in range(steps):
            if step in checkpoint_steps:
                save_checkpoint(module, out / f"step_{step}.safetensors", step=step)
                saved.append(step)
            seq = sample_sequences(trans, pi, batch_size, SEQ - 1, gen)
            x, y = pack_causal_lm(seq)
            sums, counts = objective.example_losses(module, x, y)
            loss = sums.sum() / counts.sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            for group in opt.param_groups:
                group["lr"] = lr * 0.5 * (1 + math.cos(math.pi * (step + 1) / steps))
            last = float(loss.detach())
            first = last if step == 0 else first
    finally:
        torch.set_num_threads(threads)
    module.eval()
    eval_seq = sample_sequences(trans, pi, n_eval, SEQ - 1, gen)
    x, y = pack_causal_lm(eval_seq)
    with torch.no_grad():
        sums, counts = objective.example_losses(module, x, y)
        eval_loss = float(sums.sum() / counts.sum())
    base = type(module).__mro__[1]
    module.__class__ = base  # save_pretrained as the plain transformers class
    try:
        module.save_pretrained(out, safe_serialization=True)
    finally:
        from curvplan_worker.curvature.hf import _packed_class

        module.__class__ = _packed_class(base)
    # the config the engine builds from is the one save_pretrained wrote
    save_file(
        {
            "input_ids": eval_seq.contiguous(),
            "attention_mask": torch.ones_like(eval_seq).contiguous(),
        },
        str(out / "data.safetensors"),
    )
    train_seq = sample_sequences(
        trans, pi, n_train, SEQ - 1, torch.Generator().manual_seed(seed + 1_000_003)
    )
    save_file(
        {
            "input_ids": train_seq.contiguous(),
            "attention_mask": torch.ones_like(train_seq).contiguous(),
        },
        str(out / "train.safetensors"),
    )
    summary = {
        "arch": arch,
        "intermediate_checkpoints": [f"step_{n}.safetensors" for n in saved],
        "n_train": n_train,
        "steps": steps,
        "first_train_loss": first,
        "last_train_loss": last,
        "eval_loss": eval_loss,
        "entropy_rate": entropy_rate(trans, pi),
        "uniform_loss": math.log(VOCAB),
        "n_parameters": sum(p.numel() for p in module.parameters()),
        "seed": seed,
    }
    (out / "example.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
