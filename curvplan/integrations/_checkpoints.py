"""What the training-framework callbacks share (``huggingface``, ``lightning``): when to save,
the ``step_<n>.safetensors`` file with the step and the logged loss in its metadata (the keys
the worker reads: ``step``, ``loss``; docs/integrations.md#hugging-face-trainer), and the
analyze job submitted when training ends.

Torch and safetensors are imported inside the functions: the client package imports without
them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STEP_FILE = "step_{step}.safetensors"


@dataclass(frozen=True)
class SaveSchedule:
    """The steps to save at: explicit ``save_steps`` and/or every ``every`` steps."""

    save_steps: frozenset[int]
    every: int | None

    @classmethod
    def checked(cls, save_steps: Sequence[int], every: int | None) -> SaveSchedule:
        if any(not isinstance(s, int) or s <= 0 for s in save_steps):
            raise ValueError(f"save_steps: positive integers, got {list(save_steps)}")
        if every is not None and every <= 0:
            raise ValueError(f"every: a positive number of steps, got {every}")
        if not save_steps and every is None:
            raise ValueError("say when to save: save_steps=[…] and/or every=N")
        return cls(frozenset(save_steps), every)

    def due(self, step: int) -> bool:
        return step in self.save_steps or (
            self.every is not None and step > 0 and step % self.every == 0
        )


def write_step_checkpoint(
    named_parameters: Iterable[tuple[str, Any]],
    output_dir: Path,
    step: int,
    *,
    loss: float,
    loss_step: int,
    source: str,
) -> Path:
    """Write the parameters as ``output_dir/step_<step>.safetensors`` (names as given, each
    tensor once) with ``step``, ``source`` and, when ``loss`` is finite, ``loss`` (``repr``:
    the float round-trips exactly) and ``loss_step`` in the metadata; returns the path."""
    from safetensors.torch import save_file

    metadata = {"format": "pt", "step": str(step), "source": source}
    if math.isfinite(loss):
        metadata |= {"loss": repr(loss), "loss_step": str(loss_step)}
    tensors = {n: p.detach().cpu().contiguous() for n, p in named_parameters}
    output_dir.mkdir(parents=True, exist_ok=True)
    path = output_dir / STEP_FILE.format(step=step)
    save_file(tensors, str(path), metadata=metadata)
    return path


def read_step_metadata(path: str | Path) -> dict[str, str]:
    """The safetensors metadata of a checkpoint a callback wrote (header only)."""
    from safetensors import safe_open

    with safe_open(str(path), "np") as fh:
        return dict(fh.metadata() or {})


def step_of(path: Path) -> int:
    """The step of a ``step_<n>.safetensors`` path."""
    return int(path.stem.removeprefix("step_"))


@dataclass(frozen=True)
class Submission:
    """What the callbacks submit when training ends: an analyze job of the final model with
    its intermediate checkpoints on the evaluation sample ``dataset`` (a file, or an uploaded
    artifact's id), named ``name``, with ``targets`` and ``options``; ``wait`` for its result
    (at most ``timeout`` s)."""

    dataset: str | Path
    name: str | None = None
    targets: Mapping[str, Any] | None = None
    options: Mapping[str, Any] | None = None
    wait: bool = False
    timeout: float | None = None

    def submit(
        self,
        client: Any,
        model_dir: Path,
        intermediates: Sequence[Path],
        on_submitted: Callable[[Any], None] = lambda job: None,
    ) -> Any:
        """Submit ``model_dir`` (a ``save_pretrained`` directory, w*) with the
        ``intermediates`` (their step and loss travel in their metadata); wait for its result
        when ``wait`` (``on_submitted(job)`` is called first, so that a wait that times out
        still leaves the queued job known). ``client`` None: a ``curvplan.Client`` from
        ``$CURVPLAN_URL`` and ``$CURVPLAN_API_KEY`` (closed afterwards). Returns the job."""
        import curvplan

        api = client or curvplan.Client()
        try:
            job = api.submit_analyze(
                model_dir,
                dataset=self.dataset,
                intermediate_checkpoints=list(intermediates),
                name=self.name,
                targets=self.targets,
                options=self.options,
            )
            on_submitted(job)
            return api.wait(job.id, timeout=self.timeout) if self.wait else job
        finally:
            if client is None:
                api.close()
