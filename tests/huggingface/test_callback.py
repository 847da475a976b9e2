"""``curvplan.integrations.huggingface.CurvplanCallback`` in a real (tiny, offline) Trainer run:
each checkpoint holds the weights of its step, and its safetensors metadata the step and the
loss the Trainer logged, read back as the service reads them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch


def _tiny_run(out: Path, callbacks: list[Any], steps: int = 20) -> Any:
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        PrinterCallback,
        Trainer,
        TrainingArguments,
    )

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=16, n_positions=16, n_embd=16, n_layer=1, n_head=2, bos_token_id=0,
        eos_token_id=0,
    )  # fmt: skip
    model = GPT2LMHeadModel(config)
    seq = torch.randint(0, 16, (256, 16), generator=torch.Generator().manual_seed(1))
    data = [{"input_ids": s, "labels": s} for s in seq]
    args = TrainingArguments(
        output_dir=str(out / "trainer"), max_steps=steps, per_device_train_batch_size=8,
        learning_rate=1e-2, logging_steps=4, save_strategy="no", report_to="none",
        use_cpu=True, disable_tqdm=True, seed=0,
    )  # fmt: skip
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=callbacks)
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    return trainer


def test_checkpoints_carry_their_step_weights_and_logged_loss(tmp_path: Path) -> None:
    from transformers import TrainerCallback

    from curvplan.integrations.huggingface import CurvplanCallback, read_step_metadata
    from curvplan_worker.analyze.pipeline import checkpoint_logged_loss, checkpoint_step

    snapshots: dict[int, dict[str, torch.Tensor]] = {}

    class Snapshot(TrainerCallback):  # the weights right after each step's update
        def on_step_end(self, args, state, control, model=None, **kwargs):  # type: ignore[no-untyped-def]
            snapshots[state.global_step] = {
                n: p.detach().clone() for n, p in model.named_parameters()
            }

    callback = CurvplanCallback(tmp_path / "ckpt", save_steps=[6], every=8)
    trainer = _tiny_run(tmp_path, [Snapshot(), callback])
    assert [p.name for p in callback.saved] == [
        "step_6.safetensors", "step_8.safetensors", "step_16.safetensors"
    ]  # fmt: skip
    logged = {e["step"]: e["loss"] for e in trainer.state.log_history if "loss" in e}
    assert sorted(logged) == [4, 8, 12, 16, 20]
    from safetensors.torch import load_file

    for path, step, loss_step in zip(callback.saved, (6, 8, 16), (4, 8, 16), strict=True):
        meta = read_step_metadata(path)
        assert meta["step"] == str(step) and meta["loss_step"] == str(loss_step)
        assert float(meta["loss"]) == logged[loss_step]  # exactly: repr round-trips a float
        # what the service reads from the uploaded file
        assert checkpoint_step(str(path)) == step
        assert checkpoint_logged_loss(str(path)) == logged[loss_step]
        saved = load_file(str(path))
        assert set(saved) == set(snapshots[step])  # tied lm_head once (named_parameters)
        for name, tensor in saved.items():
            assert torch.equal(tensor, snapshots[step][name]), (step, name)
    first, last = load_file(str(callback.saved[0])), snapshots[20]
    assert not torch.equal(first["transformer.wte.weight"], last["transformer.wte.weight"])
    assert callback.job is None  # nothing submitted without submit_dataset


def test_callback_arguments_are_checked() -> None:
    from curvplan.integrations.huggingface import CurvplanCallback

    with pytest.raises(ValueError, match="say when to save"):
        CurvplanCallback("x")
    with pytest.raises(ValueError, match="save_steps"):
        CurvplanCallback("x", save_steps=[0])
    with pytest.raises(ValueError, match="every"):
        CurvplanCallback("x", every=-2)
