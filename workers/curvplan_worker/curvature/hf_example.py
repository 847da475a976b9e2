"""A tiny Hugging Face GPT-2 or Llama trained offline on the Markov-chain language by the
Hugging Face ``Trainer`` (``curvplan example --arch gpt2|llama``).

Writes a Trainer output folder: one ``checkpoint-<step>`` subfolder per save (``config.json``,
``model.safetensors`` and ``trainer_state.json`` with the logged losses, exactly as
``Trainer`` writes them; ``save_only_model``, so no optimizer pickles), the final model again
at the top (``trainer.save_model``: ``config.json`` + ``model.safetensors``), the held-out
evaluation sample as Hugging Face tokenized data (``data.safetensors`` with ``input_ids`` and
``attention_mask``; labels are implied: the next tokens) and training sequences of the same
language for sweeps (``train.safetensors``, same format). ``curvplan analyze --model DIR``
takes the folder as a run: its last checkpoint is w*, the earlier ones give the noise-scale
trend (``budget.batch``); ``curvplan curvature --model DIR`` and ``curvplan sweep --model DIR``
run on the same architecture. The language is the one of ``example.py``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TypedDict

import torch

from curvplan_worker.curvature.example import entropy_rate, markov_chain, sample_sequences
from curvplan_worker.curvature.hf import _packed_class, build_hf_model, pack_causal_lm
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


class _LanguageStream(torch.utils.data.IterableDataset):
    """Fresh sequences of the language, batch after batch (the language is unlimited, so the
    model trains on new samples every step, as the reference example does)."""

    def __init__(self, trans: torch.Tensor, pi: torch.Tensor, seed: int) -> None:
        self.trans, self.pi, self.seed = trans, pi, seed

    def __iter__(self):  # type: ignore[no-untyped-def]
        gen = torch.Generator().manual_seed(self.seed)
        while True:
            for seq in sample_sequences(self.trans, self.pi, 256, SEQ - 1, gen):
                yield {"input_ids": seq, "attention_mask": torch.ones_like(seq), "labels": seq}


class ExampleSummary(TypedDict):
    """The run folder's ``example.json``: the run's settings, its checkpoints (the last is
    the final model) and losses, and the Trainer's own ``log_history``."""

    arch: str
    checkpoints: list[str]
    intermediate_checkpoints: list[str]
    n_train: int
    steps: int
    first_train_loss: float
    last_train_loss: float
    eval_loss: float
    entropy_rate: float
    uniform_loss: float
    n_parameters: int
    seed: int
    log_history: list[dict[str, float]]


def write_hf_example(
    out_dir: str | Path,
    arch: str = "gpt2",
    *,
    steps: int = 300,
    batch_size: int = 32,
    n_eval: int = 256,
    seed: int = 0,
    lr: float = 3e-3,
    n_train: int = 4096,
    save_steps: int = 50,
    logging_steps: int = 10,
) -> ExampleSummary:
    """Train the tiny ``arch`` model with the Hugging Face ``Trainer`` for ``steps`` steps
    (AdamW, cosine decay, a checkpoint every ``save_steps`` and at the end, the loss logged every
    ``logging_steps``) and write the run folder of the module docstring into ``out_dir``;
    ``train.safetensors`` holds ``n_train`` further sequences from a generator of their own (the
    trained model does not depend on ``n_train``). Returns a summary, with the Trainer's own
    ``log_history``."""
    if arch not in EXAMPLE_CONFIGS:
        raise ValueError(f"arch: expected one of {sorted(EXAMPLE_CONFIGS)}, got {arch!r}")
    from safetensors.torch import save_file
    from transformers import PrinterCallback, Trainer, TrainingArguments
    from transformers.utils import logging as hf_logging

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = EXAMPLE_CONFIGS[arch]
    gen = torch.Generator().manual_seed(seed)
    trans, pi = markov_chain(VOCAB, gen)
    model = build_hf_model(config, seed=seed)
    module = model.module
    base = type(module).__mro__[1]
    module.__class__ = base  # the plain transformers class: the Trainer calls its forward
    args = TrainingArguments(
        output_dir=str(out),
        max_steps=steps,
        per_device_train_batch_size=batch_size,
        learning_rate=lr,
        lr_scheduler_type="cosine",
        warmup_steps=0,
        weight_decay=0.0,
        logging_strategy="steps",
        logging_steps=logging_steps,
        save_strategy="steps",
        save_steps=save_steps,
        save_only_model=True,
        report_to="none",
        use_cpu=True,
        seed=seed,
        dataloader_num_workers=0,
        disable_tqdm=True,
        log_level="error",
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    progress_bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        module.train()
        trainer = Trainer(
            model=module, args=args, train_dataset=_LanguageStream(trans, pi, seed + 17)
        )
        trainer.remove_callback(PrinterCallback)
        trainer.train()
        trainer.save_model(str(out))  # the final model (w*) at the top, as save_pretrained
    finally:
        torch.set_num_threads(threads)
        if progress_bars:
            hf_logging.enable_progress_bar()
        module.__class__ = _packed_class(base)
    module.eval()
    eval_seq = sample_sequences(trans, pi, n_eval, SEQ - 1, gen)
    x, y = pack_causal_lm(eval_seq)
    with torch.no_grad():
        sums, counts = CausalLMObjective().example_losses(module, x, y)
        eval_loss = float(sums.sum() / counts.sum())
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
    history = [dict(entry) for entry in trainer.state.log_history]
    losses = [e["loss"] for e in history if "loss" in e]
    checkpoints = sorted(
        (p for p in out.iterdir() if p.is_dir() and p.name.startswith("checkpoint-")),
        key=lambda p: int(p.name.split("-", 1)[1]),
    )
    summary: ExampleSummary = {
        "arch": arch,
        "checkpoints": [p.name for p in checkpoints],
        "intermediate_checkpoints": [p.name for p in checkpoints[:-1]],
        "n_train": n_train,
        "steps": steps,
        "first_train_loss": losses[0] if losses else math.nan,
        "last_train_loss": losses[-1] if losses else math.nan,
        "eval_loss": eval_loss,
        "entropy_rate": entropy_rate(trans, pi),
        "uniform_loss": math.log(VOCAB),
        "n_parameters": sum(p.numel() for p in module.parameters()),
        "seed": seed,
        "log_history": history,
    }
    (out / "example.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
