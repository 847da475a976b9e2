"""``curvplan.integrations.lightning.CurvplanCallback`` in a real (tiny, CPU, offline) Lightning
run: each checkpoint holds the module's weights of its step (captured independently by a
test-side callback), its safetensors metadata the step and the loss the run logged there
(read back from the CSV logger's file and as the service reads it), and no pickle."""

from __future__ import annotations

import csv
import json
import struct
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

pytest.importorskip("lightning")

STEPS = 60


def _tiny_fit(out: Path, callbacks: list[Any], accumulate: int = 1) -> Path:
    """Fit a 2-layer MLP on random regression data for STEPS optimizer steps; returns the CSV
    logger's metrics file (train_loss logged at every step)."""
    from lightning.pytorch import LightningModule, Trainer
    from lightning.pytorch.loggers import CSVLogger
    from torch.utils.data import DataLoader, TensorDataset

    class MLP(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(
                torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)
            )

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("train_loss", loss, on_step=True, on_epoch=False)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.05)

    torch.manual_seed(0)
    x = torch.randn(256, 4, generator=torch.Generator().manual_seed(1))
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [0.0]]) + 0.1 * torch.randn(256, 1)
    loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
    logger = CSVLogger(str(out), name="csv", version=0)
    trainer = Trainer(
        max_steps=STEPS, accelerator="cpu", devices=1, logger=logger, log_every_n_steps=1,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=callbacks, accumulate_grad_batches=accumulate,
    )  # fmt: skip
    trainer.fit(MLP(), loader)
    return Path(logger.log_dir) / "metrics.csv"


def _snapshot_callback(snapshots: dict[int, dict[str, torch.Tensor]]) -> Any:
    from lightning.pytorch.callbacks import Callback

    class Snapshot(Callback):  # the weights at the end of each batch, keyed by global step
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):  # type: ignore[no-untyped-def]
            snapshots.setdefault(trainer.global_step, {
                n: p.detach().clone() for n, p in pl_module.state_dict().items()
            })  # fmt: skip

    return Snapshot()


def _logged_losses(metrics_csv: Path) -> dict[int, float]:
    """step → train_loss as the CSV logger wrote them (Lightning logs a step's metrics under
    the number of steps taken before it)."""
    with metrics_csv.open() as fh:
        return {int(r["step"]) + 1: float(r["train_loss"]) for r in csv.DictReader(fh)}


def _safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file, parsed by hand: 8-byte length, then JSON, then
    raw tensor bytes (no pickle opcode stream anywhere)."""
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    body = len(data) - 8 - length
    assert max(t["data_offsets"][1] for k, t in header.items() if k != "__metadata__") == body
    return header


def test_checkpoints_carry_their_step_weights_and_logged_loss(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from curvplan.integrations.lightning import CurvplanCallback, read_step_metadata
    from curvplan_worker.analyze.pipeline import checkpoint_logged_loss, checkpoint_step

    snapshots: dict[int, dict[str, torch.Tensor]] = {}
    callback = CurvplanCallback(tmp_path / "ckpt", save_steps=[7, 13], every=25)
    metrics = _tiny_fit(tmp_path, [_snapshot_callback(snapshots), callback])
    logged = _logged_losses(metrics)
    assert sorted(logged) == list(range(1, STEPS + 1))
    names = [p.name for p in callback.saved]
    assert names == [f"step_{s}.safetensors" for s in (7, 13, 25, 50)]
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == sorted(names)
    for path, step in zip(callback.saved, (7, 13, 25, 50), strict=True):
        header = _safetensors_header(path)
        assert header["__metadata__"] == read_step_metadata(path)
        meta = read_step_metadata(path)
        assert meta["step"] == str(step) and meta["loss_step"] == str(step)
        assert float(meta["loss"]) == logged[step]  # exactly: repr round-trips the float
        assert meta["source"] == "curvplan.integrations.lightning"
        # what the service reads from the uploaded file
        assert checkpoint_step(str(path)) == step
        assert checkpoint_logged_loss(str(path)) == logged[step]
        saved = load_file(str(path))
        assert set(saved) == set(snapshots[step]) == {
            "net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias"
        }  # fmt: skip
        for name, tensor in saved.items():
            assert torch.equal(tensor, snapshots[step][name]), (step, name)
    first, last = load_file(str(callback.saved[0])), snapshots[STEPS]
    assert not torch.equal(first["net.0.weight"], last["net.0.weight"])  # it did train
    assert logged[7] != logged[13]


def test_gradient_accumulation_saves_each_step_once_after_its_update(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from curvplan.integrations.lightning import CurvplanCallback

    snapshots: dict[int, dict[str, torch.Tensor]] = {}
    callback = CurvplanCallback(tmp_path / "ckpt", every=20, submodule="net")
    _tiny_fit(tmp_path, [_snapshot_callback(snapshots), callback], accumulate=2)
    assert [p.name for p in callback.saved] == [f"step_{s}.safetensors" for s in (20, 40, 60)]
    saved = load_file(str(callback.saved[0]))
    assert set(saved) == {"0.weight", "0.bias", "2.weight", "2.bias"}  # the submodule's names
    for name, tensor in saved.items():  # the weights right after step 20's update
        assert torch.equal(tensor, snapshots[20][f"net.{name}"]), name
    assert not torch.equal(saved["0.weight"], snapshots[19]["net.0.weight"])


def test_callback_arguments_are_checked() -> None:
    from curvplan.integrations.lightning import CurvplanCallback

    with pytest.raises(ValueError, match="say when to save"):
        CurvplanCallback("x")
    with pytest.raises(ValueError, match="save_steps"):
        CurvplanCallback("x", save_steps=[0])
    with pytest.raises(ValueError, match="every"):
        CurvplanCallback("x", every=-2)


class _Via(httpx.BaseTransport):
    """The client library's requests, sent through the test app's client (the real API)."""

    def __init__(self, test_client: Any) -> None:
        self.test_client = test_client

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        answer = self.test_client.request(
            request.method, str(request.url), content=request.read(), headers=request.headers
        )
        return httpx.Response(answer.status_code, headers=answer.headers, content=answer.content)


def test_submit_at_the_end_queues_an_analysis_with_the_intermediates(
    client: Any, api_key: str, auth_headers: dict[str, str], tmp_path: Path
) -> None:
    """A LightningModule wrapping a tiny GPT-2 as ``self.model``: at the end the callback saves
    it (w*) and submits it with the earlier checkpoints to the real API (no worker runs)."""
    from lightning.pytorch import LightningModule, Trainer
    from lightning.pytorch.callbacks import Callback
    from safetensors.torch import save_file
    from torch.utils.data import DataLoader
    from transformers import GPT2Config, GPT2LMHeadModel

    import curvplan
    from curvplan.integrations.lightning import CurvplanCallback

    class LM(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            config = GPT2Config(
                vocab_size=16, n_positions=16, n_embd=16, n_layer=1, n_head=2, bos_token_id=0,
                eos_token_id=0,
            )  # fmt: skip
            self.model = GPT2LMHeadModel(config)

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
            loss = self.model(input_ids=batch, labels=batch).loss
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-2)

    returned: dict[int, float] = {}

    class Returned(Callback):  # the loss training_step returned, by the step it completed
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):  # type: ignore[no-untyped-def]
            returned[trainer.global_step] = float(outputs["loss"])

    torch.manual_seed(0)
    seq = torch.randint(0, 16, (128, 16), generator=torch.Generator().manual_seed(1))
    save_file({"input_ids": seq[:32].contiguous()}, str(tmp_path / "eval.safetensors"))
    with curvplan.Client("http://testserver", api_key, transport=_Via(client)) as api:
        callback = CurvplanCallback(
            tmp_path / "ckpt", save_steps=[4, 8, 12], submodule="model",
            submit_dataset=tmp_path / "eval.safetensors", submit_name="lightning-run", client=api,
        )  # fmt: skip
        trainer = Trainer(
            max_steps=12, accelerator="cpu", logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False, callbacks=[Returned(), callback],
        )  # fmt: skip
        trainer.fit(LM(), DataLoader(list(seq), batch_size=8))
    assert callback.job is not None
    job = client.get(f"/v1/jobs/{callback.job.id}", headers=auth_headers).json()
    assert job["kind"] == "analyze" and job["status"] == "queued" and job["name"] == "lightning-run"
    request = job["request"]
    assert request["model"]["source"] == "huggingface"
    assert len(request["intermediate_checkpoints"]) == 2  # steps 4 and 8; 12 is w*
    for artifact_id, step in zip(request["intermediate_checkpoints"], (4, 8), strict=True):
        stored = client.get(f"/v1/artifacts/{artifact_id}", headers=auth_headers).json()
        assert stored["name"] == f"step_{step}.safetensors" and stored["kind"] == "checkpoint"
        assert stored["metadata"]["step"] == str(step)
        assert float(stored["metadata"]["loss"]) == returned[step]  # what training_step gave
        assert "lm_head.weight" not in stored["tensors"]  # tied to wte: once, as w* has it
    assert (tmp_path / "ckpt" / "final" / "model.safetensors").is_file()


def test_submit_needs_a_model_with_save_pretrained(tmp_path: Path) -> None:
    from curvplan.integrations.lightning import CurvplanCallback

    callback = CurvplanCallback(tmp_path, every=5, submit_dataset="eval.safetensors")
    with pytest.raises(ValueError, match="save_pretrained"):
        _tiny_fit(tmp_path, [callback])
    assert callback.saved == []  # refused before the first step
