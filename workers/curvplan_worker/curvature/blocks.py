"""Parameter blocks of the engine contract ("Blocks").

Default block names: ``embed`` (``embed.*`` and ``pos.*``), per layer ``layers.{i}.ln1``,
``.q``, ``.k``, ``.v``, ``.o``, ``.ln2``, ``.ffn_in``, ``.ffn_out``, then ``final_norm`` and
``head``; each block holds the weight and the bias. Tied tensors appear once in
``named_parameters()`` (under their first name, ``embed.weight``) and so belong to one block.

A block Hessian is the diagonal block H_BB of the full Hessian with every other parameter held
at w* (docs/numerics.md#blocks), not the Hessian of a block-only model.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping, Sequence

from torch import nn


class BlockError(ValueError):
    """Block patterns that match nothing or assign a parameter twice."""


_LAYER_RE = re.compile(r"^layers\.(\d+)\.(.+)$")
_SUBLAYER = {
    "ln1": "ln1",
    "attn.q": "q",
    "attn.k": "k",
    "attn.v": "v",
    "attn.o": "o",
    "ln2": "ln2",
    "ffn_in": "ffn_in",
    "ffn_out": "ffn_out",
}


def default_block_of(param_name: str) -> str:
    """The default block name of one contract parameter name."""
    head, _, _ = param_name.rpartition(".")
    match = _LAYER_RE.match(head)
    if match:
        layer, sub = match.groups()
        return f"layers.{layer}.{_SUBLAYER.get(sub, sub)}"
    if head in ("embed", "pos"):
        return "embed"
    return head or param_name


def _names(model_or_names: nn.Module | Iterable[str]) -> list[str]:
    if isinstance(model_or_names, nn.Module):
        return [n for n, _ in model_or_names.named_parameters()]
    return list(model_or_names)


def default_blocks(model_or_names: nn.Module | Iterable[str]) -> dict[str, list[str]]:
    """``{block name: [parameter names]}`` in parameter order (engine contract defaults)."""
    blocks: dict[str, list[str]] = {}
    for name in _names(model_or_names):
        blocks.setdefault(default_block_of(name), []).append(name)
    return blocks


def custom_blocks(
    model_or_names: nn.Module | Iterable[str], patterns: Mapping[str, Sequence[str]]
) -> dict[str, list[str]]:
    """Blocks defined by parameter-name patterns: ``{"attn0": ["layers.0.attn.*"], ...}``.

    Each parameter may belong to at most one block; a pattern matching nothing is an error.
    A pattern written as a slice (``name[:, a:b]`` or ``name[a:b]``) is taken literally: that
    slice of the last dimension of the parameter (e.g. one of GPT-2's fused q/k/v).
    """
    names = _names(model_or_names)
    owner: dict[str, str] = {}
    blocks: dict[str, list[str]] = {}
    for block, pats in patterns.items():
        members: list[str] = []
        for pat in pats:
            if _is_slice(pat):  # a literal slice member, e.g. "h.0.attn.c_attn.weight[:, 0:64]"
                base = pat[: pat.index("[")]
                if base not in names:
                    raise BlockError(f"block {block!r}: {pat!r} slices no parameter")
                if pat in owner and owner[pat] != block:
                    raise BlockError(f"{pat!r} is in both block {owner[pat]!r} and {block!r}")
                owner[pat] = block
                if pat not in members:
                    members.append(pat)
                continue
            hits = [n for n in names if fnmatch.fnmatchcase(n, pat)]
            if not hits:
                raise BlockError(f"block {block!r}: pattern {pat!r} matches no parameter")
            for hit in hits:
                if hit in owner and owner[hit] != block:
                    raise BlockError(
                        f"parameter {hit!r} is in both block {owner[hit]!r} and {block!r}"
                    )
                if hit not in members:
                    owner[hit] = block
                    members.append(hit)
        blocks[block] = [n for n in names if n in members] + [m for m in members if _is_slice(m)]
    return blocks


def _is_slice(pattern: str) -> bool:
    from curvplan_worker.curvature.operator import parse_member

    return parse_member(pattern).is_slice


def select_blocks(
    blocks: Mapping[str, list[str]], patterns: Sequence[str] | None
) -> dict[str, list[str]]:
    """Keep the blocks whose name matches any ``fnmatch`` pattern (all when ``None``)."""
    if not patterns:
        return dict(blocks)
    chosen = {
        b: p for b, p in blocks.items() if any(fnmatch.fnmatchcase(b, pat) for pat in patterns)
    }
    if not chosen:
        raise BlockError(f"block patterns {list(patterns)} match none of the blocks {list(blocks)}")
    return chosen
