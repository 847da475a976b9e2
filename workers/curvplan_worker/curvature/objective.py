"""Loss objectives (engine contract, "Objective").

``example_losses(model, inputs, targets)`` returns the per-example *summed* loss (n,) and the
per-example number of loss terms (n,): tokens that are not ``ignore_index`` for causal_lm, 1 for
classification, the number of elements for regression. The dataset loss is
``sum(losses) / sum(counts)`` — the mean token loss over the whole evaluation sample
(docs/numerics.md#loss-normalisation), which is what every Hessian and gradient of the engine
differentiates.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from curvplan.types.spec import CausalLMTask, ClassificationTask, ModelSpec, parse_spec

IGNORE_INDEX = -100


class Objective(Protocol):
    """A loss decomposed into per-example sums and counts."""

    def example_losses(
        self, model: nn.Module, inputs: Tensor, targets: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Per-example summed loss (n,) and per-example loss-term counts (n,)."""
        ...

    def output_losses(self, outputs: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        """The same from the model outputs (used by the Gauss–Newton products)."""
        ...


class CausalLMObjective:
    """Mean next-token cross-entropy; targets equal to -100 are ignored."""

    def output_losses(self, outputs: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        """−log softmax(outputs)[target] per token (0 where ignored), summed per example.

        The same numbers as ``F.cross_entropy(..., reduction="none")`` (the same log-softmax,
        the same pick, bit for bit), written as a gather: the double backward of
        ``nll_loss_backward`` materialises a zero tensor of the logits' size
        (``zeros_like``, its derivative in the log-probabilities) and adds it in, per Hessian
        product; a gather's backward is a scatter that does not depend on the log-probabilities,
        so the second backward skips both (about 8 % of a product on the GPT-2 of
        benchmarks/bench_hvp_parts.py).
        """
        n, t, v = outputs.shape
        flat = targets.reshape(n * t)
        keep = flat != IGNORE_INDEX
        log_p = F.log_softmax(outputs.reshape(n * t, v), dim=-1)
        # ignored tokens pick class 0 and are zeroed; any other out-of-range target still fails
        picked = log_p.gather(1, flat.masked_fill(~keep, 0).unsqueeze(1)).squeeze(1)
        per_token = torch.where(keep, -picked, outputs.new_zeros(())).view(n, t)
        counts = (targets != IGNORE_INDEX).sum(dim=1).to(outputs.dtype)
        return per_token.sum(dim=1), counts

    def example_losses(
        self, model: nn.Module, inputs: Tensor, targets: Tensor
    ) -> tuple[Tensor, Tensor]:
        return self.output_losses(model(inputs), targets)


class ClassificationObjective:
    """Cross-entropy of one label per sequence; count 1 per example."""

    def output_losses(self, outputs: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        losses = F.cross_entropy(outputs, targets, reduction="none")
        return losses, torch.ones_like(losses)

    def example_losses(
        self, model: nn.Module, inputs: Tensor, targets: Tensor
    ) -> tuple[Tensor, Tensor]:
        return self.output_losses(model(inputs), targets)


class RegressionObjective:
    """Mean squared error over all elements (Petrov et al. 2025 §1.2, l = ‖·‖²_F/(L d_V))."""

    def output_losses(self, outputs: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        diff = (outputs - targets).reshape(outputs.shape[0], -1)
        losses = (diff * diff).sum(dim=1)
        counts = torch.full_like(losses, float(diff.shape[1]))
        return losses, counts

    def example_losses(
        self, model: nn.Module, inputs: Tensor, targets: Tensor
    ) -> tuple[Tensor, Tensor]:
        return self.output_losses(model(inputs), targets)


def objective_for(spec: ModelSpec | dict) -> Objective:
    """The objective of the spec's task."""
    task = parse_spec(spec).task
    if isinstance(task, CausalLMTask):
        return CausalLMObjective()
    if isinstance(task, ClassificationTask):
        return ClassificationObjective()
    return RegressionObjective()


def dataset_loss(objective: Objective, model: nn.Module, inputs: Tensor, targets: Tensor) -> Tensor:
    """sum of example losses / sum of counts on one tensor batch (the evaluation loss)."""
    losses, counts = objective.example_losses(model, inputs, targets)
    return losses.sum() / counts.sum()
