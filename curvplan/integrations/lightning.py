"""A PyTorch Lightning callback that keeps what curvplan's batch answer needs.

The Lightning twin of :mod:`curvplan.integrations.huggingface`: the noise-scale trend that
answers ``budget.batch`` is measured at checkpoints taken before convergence (McCandlish et
al. 2018 §2.2; docs/budget.md). :class:`CurvplanCallback` saves the LightningModule's
parameters at the steps you choose as ``step_<n>.safetensors`` — safetensors only, never a
pickle — with the step and the training loss logged there in the file's metadata (``step``,
``loss``, ``loss_step``), where the service reads them::

    from lightning.pytorch import Trainer
    from curvplan.integrations.lightning import CurvplanCallback

    callback = CurvplanCallback(
        "curvplan-checkpoints", save_steps=[50, 100], every=500,
        submodule="model",                    # self.model: a Hugging Face model
        submit_dataset="eval.safetensors",    # optional: submit when training ends
    )
    Trainer(max_steps=1000, callbacks=[callback]).fit(module, train_loader)
    print(callback.job.id)

Only the global-zero process writes and submits. Needs ``pip install 'curvplan[lightning]'``
(the client itself does not; docs/integrations.md#pytorch-lightning).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

try:
    from lightning.pytorch.callbacks import Callback
except ImportError as exc:  # the optional extra
    raise ImportError(
        "curvplan.integrations.lightning needs lightning: pip install 'curvplan[lightning]'"
    ) from exc

from curvplan.integrations._checkpoints import (
    STEP_FILE,
    SaveSchedule,
    Submission,
    read_step_metadata,
    step_of,
    write_step_checkpoint,
)

__all__ = ["STEP_FILE", "CurvplanCallback", "logged_loss", "read_step_metadata"]

METADATA_SOURCE = "curvplan.integrations.lightning"
FINAL_DIR = "final"


def logged_loss(metrics: Mapping[str, Any], outputs: Any, loss_key: str) -> float:
    """The training loss of the step that just ended: the value ``training_step`` logged as
    ``loss_key`` (``self.log(loss_key, …)``; ``<loss_key>_step`` when logged on step and on
    epoch), else the loss ``training_step`` returned; NaN when there is neither."""
    for key in (loss_key, f"{loss_key}_step"):
        if key in metrics:
            return float(metrics[key])
    returned = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
    try:
        return float(returned) if returned is not None else math.nan
    except (TypeError, ValueError):
        return math.nan


class CurvplanCallback(Callback):
    """Save intermediate checkpoints of the LightningModule's parameters, with the step and the
    logged training loss in their safetensors metadata (module docstring).

    ``save_steps`` (explicit steps) and/or ``every`` (a period) choose the steps, counted as
    ``trainer.global_step`` (optimizer steps: with gradient accumulation, once per step). A
    checkpoint is written at the end of the batch that completed the step, with the weights
    after its update and the loss logged under ``loss_key`` in that step's ``training_step``
    (``loss_step`` is the step itself). Only the global-zero process writes; the parameters
    are those of ``named_parameters()`` on that process (not a sharded FSDP/DeepSpeed model).
    ``submodule`` (a dotted attribute path, e.g. ``"model"`` for a LightningModule that wraps
    a Hugging Face model as ``self.model``) saves that submodule's parameters under its own
    names, the names the service's model spec expects. The written paths are :attr:`saved`.

    With ``submit_dataset`` (an evaluation sample: a file, or an uploaded artifact's id) the
    trained model (``submodule``, or the module itself; it must have ``save_pretrained``:
    checked when fitting starts) is saved to ``output_dir/final`` when training ends and an
    analyze job is submitted with every intermediate checkpoint before the last step;
    ``submit_wait`` waits for its result. ``client`` (a ``curvplan.Client``) replaces the one
    built from ``$CURVPLAN_URL`` and ``$CURVPLAN_API_KEY``. The submitted job is :attr:`job`.
    """

    def __init__(
        self,
        output_dir: str | Path,
        *,
        save_steps: Sequence[int] = (),
        every: int | None = None,
        loss_key: str = "train_loss",
        submodule: str | None = None,
        submit_dataset: str | Path | None = None,
        submit_name: str | None = None,
        submit_targets: Mapping[str, Any] | None = None,
        submit_options: Mapping[str, Any] | None = None,
        submit_wait: bool = False,
        submit_timeout: float | None = None,
        client: Any = None,
    ) -> None:
        self.schedule = SaveSchedule.checked(save_steps, every)
        self.output_dir = Path(output_dir)
        self.loss_key = loss_key
        self.submodule = submodule
        self.submission = (
            None
            if submit_dataset is None
            else Submission(
                submit_dataset,
                submit_name,
                submit_targets,
                submit_options,
                submit_wait,
                submit_timeout,
            )
        )
        self.client = client
        self.saved: list[Path] = []
        self.job: Any = None
        self._last_saved_step = -1

    def _saved_module(self, pl_module: Any) -> Any:
        return pl_module.get_submodule(self.submodule) if self.submodule else pl_module

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        module = self._saved_module(pl_module)
        if self.submission is not None and not hasattr(module, "save_pretrained"):
            raise ValueError(
                f"submit_dataset: the submitted model needs save_pretrained, and "
                f"{self.submodule or 'the LightningModule'} ({type(module).__name__}) has "
                "none: name a Hugging Face model with submodule=…"
            )

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        if step == self._last_saved_step or not self.schedule.due(step):
            return  # (a batch that only accumulated gradients keeps the step it follows)
        self._last_saved_step = step
        if not trainer.is_global_zero:
            return
        loss = logged_loss(trainer.callback_metrics, outputs, self.loss_key)
        path = write_step_checkpoint(
            self._saved_module(pl_module).named_parameters(),
            self.output_dir,
            step,
            loss=loss,
            loss_step=step,
            source=METADATA_SOURCE,
        )
        self.saved.append(path)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self.submission is None or not trainer.is_global_zero:
            return
        final = self.output_dir / FINAL_DIR
        self._saved_module(pl_module).save_pretrained(str(final), safe_serialization=True)
        self.job = self.submission.submit(
            self.client,
            final,
            [p for p in self.saved if step_of(p) < trainer.global_step],
            self._set_job,
        )

    def _set_job(self, job: Any) -> None:
        self.job = job
