"""A Hugging Face ``TrainerCallback`` that keeps what curvplan's batch answer needs.

The noise-scale trend that answers ``budget.batch`` is measured at checkpoints taken before
convergence (McCandlish et al. 2018 §2.2; docs/budget.md). :class:`CurvplanCallback`
saves the model's parameters at the steps you choose as ``step_<n>.safetensors`` — safetensors
only, never a pickle — with the step and the training loss the run logged there in the file's
metadata (``step``, ``loss``, ``loss_step``), where the service reads them. At the end of
training it can save the final model (``save_pretrained``: w*) and submit the analysis::

    from curvplan.integrations.huggingface import CurvplanCallback

    callback = CurvplanCallback(
        "curvplan-checkpoints", save_steps=[50, 100, 200],
        submit_dataset="eval.safetensors",  # input_ids [+ attention_mask] [+ labels]
        submit_name="my-run",                 # CURVPLAN_URL, CURVPLAN_API_KEY
    )
    Trainer(model=model, args=args, train_dataset=ds, callbacks=[callback]).train()
    print(callback.job.id)

Only the main process writes and submits. Needs ``pip install 'curvplan[huggingface]'``
(transformers; the client itself does not). A Trainer output folder without this callback works
as well: ``curvplan analyze --model RUN_DIR`` reads its ``checkpoint-<step>`` subfolders
(docs/model-sources.md#trainer-run-folders).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from curvplan.integrations._checkpoints import (
    STEP_FILE,
    SaveSchedule,
    Submission,
    read_step_metadata,
    step_of,
    write_step_checkpoint,
)

try:
    from transformers import TrainerCallback
except ImportError as exc:  # the optional extra
    raise ImportError(
        "curvplan.integrations.huggingface needs transformers: pip install 'curvplan[huggingface]'"
    ) from exc

__all__ = ["STEP_FILE", "CurvplanCallback", "last_logged_loss", "read_step_metadata"]

FINAL_DIR = "final"
METADATA_SOURCE = "curvplan.integrations.huggingface"


def last_logged_loss(log_history: Sequence[Mapping[str, Any]], step: int) -> tuple[float, int]:
    """``(loss, its step)`` of the last training ``loss`` logged at or before ``step`` (NaN, -1
    when none was)."""
    found: tuple[float, int] = (math.nan, -1)
    for entry in log_history:
        at = entry.get("step")
        if "loss" in entry and isinstance(at, int) and at <= step:
            found = (float(entry["loss"]), at)
    return found


class CurvplanCallback(TrainerCallback):
    """Save intermediate checkpoints (step and logged loss in their safetensors metadata) and
    optionally submit the analysis when training ends (module docstring).

    ``save_steps`` (explicit steps) and/or ``every`` (a period) choose the steps; a checkpoint
    is written after the step's logging, so that its ``loss`` is the loss logged at that very
    step when the logging interval divides it (else the last one before it: ``loss_step`` says
    which). With ``submit_dataset`` (an evaluation sample: a file, or an uploaded artifact's
    id) the final model is saved to ``output_dir/final`` and an analyze job is submitted with
    every intermediate checkpoint before the last step; ``submit_wait`` waits for its result.
    ``client`` (a ``curvplan.Client``) replaces the one built from ``$CURVPLAN_URL`` and
    ``$CURVPLAN_API_KEY``. The submitted job is :attr:`job`.
    """

    def __init__(
        self,
        output_dir: str | Path,
        *,
        save_steps: Sequence[int] = (),
        every: int | None = None,
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
        self._pending: int | None = None

    # ----------------------------------------------------------------- when to save
    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.is_world_process_zero and self.schedule.due(state.global_step):
            self._pending = state.global_step  # written after this step's logging (on_log)

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        if self._pending == state.global_step and logs and "loss" in logs:
            self._flush(kwargs.get("model"), state)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._flush(kwargs.get("model"), state)  # no log at the save step: the last one

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        model = kwargs.get("model")
        self._flush(model, state)
        if self.submission is not None and state.is_world_process_zero:
            self._submit(model, state.global_step)

    # ----------------------------------------------------------------- writing
    def _flush(self, model: Any, state: Any) -> None:
        step, self._pending = self._pending, None
        if step is None or model is None:
            return
        self.saved.append(self.save(model, step, state.log_history))

    def save(self, model: Any, step: int, log_history: Sequence[Mapping[str, Any]]) -> Path:
        """Write ``model``'s parameters at ``step`` (names of ``named_parameters()``, tied ones
        once) with ``step``, ``loss`` and ``loss_step`` in the metadata; returns the path."""
        loss, loss_step = last_logged_loss(log_history, step)
        return write_step_checkpoint(
            model.named_parameters(),
            self.output_dir,
            step,
            loss=loss,
            loss_step=loss_step,
            source=METADATA_SOURCE,
        )

    # ----------------------------------------------------------------- submitting
    def _submit(self, model: Any, final_step: int) -> None:
        final = self.output_dir / FINAL_DIR
        model.save_pretrained(str(final), safe_serialization=True)
        assert self.submission is not None
        self.job = self.submission.submit(
            self.client, final, [p for p in self.saved if step_of(p) < final_step], self._set_job
        )

    def _set_job(self, job: Any) -> None:
        self.job = job
