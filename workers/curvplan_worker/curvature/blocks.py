"""Parameter blocks of the engine contract ("Blocks") over a module's parameters.

Default block names: ``embed`` (``embed.*`` and ``pos.*``), per layer ``layers.{i}.ln1``,
``.q``, ``.k``, ``.v``, ``.o``, ``.ln2``, ``.ffn_in``, ``.ffn_out``, then ``final_norm`` and
``head``; each block holds the weight and the bias. Tied tensors appear once in
``named_parameters()`` (under their first name, ``embed.weight``) and so belong to one block.

The rules are names and shapes alone, so they live torch-free in ``curvplan_core.blocks``
(where the API plans a fan-out at submission); this module applies them to a module.

A block Hessian is the diagonal block H_BB of the full Hessian with every other parameter held
at w* (docs/numerics.md#blocks), not the Hessian of a block-only model.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from torch import nn

from curvplan_core import blocks as _rules
from curvplan_core.blocks import BlockError, default_block_of, select_blocks

__all__ = ["BlockError", "custom_blocks", "default_block_of", "default_blocks", "select_blocks"]


def _names(model_or_names: nn.Module | Iterable[str]) -> list[str]:
    if isinstance(model_or_names, nn.Module):
        return [n for n, _ in model_or_names.named_parameters()]
    return list(model_or_names)


def default_blocks(model_or_names: nn.Module | Iterable[str]) -> dict[str, list[str]]:
    """``{block name: [parameter names]}`` in parameter order (engine contract defaults)."""
    return _rules.default_blocks(_names(model_or_names))


def custom_blocks(
    model_or_names: nn.Module | Iterable[str], patterns: Mapping[str, Sequence[str]]
) -> dict[str, list[str]]:
    """Blocks defined by parameter-name patterns (``curvplan_core.blocks.custom_blocks``)."""
    return _rules.custom_blocks(_names(model_or_names), patterns)
