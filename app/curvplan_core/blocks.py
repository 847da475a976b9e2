"""Parameter blocks by name alone (torch-free): what the engine's blocks are, from names and shapes.

The engine contract's block rules ("Blocks", docs/numerics.md#blocks) need only parameter names
and shapes, so they live here, where the API can apply them to a model it never builds (its
config or spec and its checkpoint's safetensors header) and plan a fan-out at submission; the
engine (``curvplan_worker.curvature.blocks`` and ``.hf``) applies the same functions to its
module's ``named_parameters()``. A worker test checks that both give the same blocks.

* Reference models: ``embed`` (``embed.*`` and ``pos.*``), per layer ``layers.{i}.ln1``, ``.q``,
  ``.k``, ``.v``, ``.o``, ``.ln2``, ``.ffn_in``, ``.ffn_out``, then ``final_norm`` and ``head``
  (:func:`default_blocks`).
* Hugging Face models: the same uniform ids over the transformers names, GPT-2's fused
  ``attn.c_attn`` split into q, k, v column slices (:func:`uniform_blocks`).
* Custom blocks: parameter-name patterns, or literal slices ``name[:, a:b]`` / ``name[a:b]`` of
  the last dimension (:func:`custom_blocks`).
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

Shape = tuple[int, ...]


class BlockError(ValueError):
    """Block patterns that match nothing or assign a parameter twice."""


class UnknownBlocks(ValueError):
    """Off-diagonal pairs naming blocks that are not selected."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        super().__init__(f"unknown or unselected blocks {names}")


# --------------------------------------------------------------------------- members
_SLICE = re.compile(r"^(?P<name>[^\[\]\s]+)\[(?P<cols>:,\s*)?(?P<a>\d+):(?P<b>\d+)\]$")


@dataclass(frozen=True)
class SliceSpec:
    """A written slice member: ``name[:, a:b]`` (rank 2) or ``name[a:b]`` (rank 1)."""

    name: str
    start: int
    stop: int
    rank: int


def parse_slice(text: str) -> SliceSpec | None:
    """The slice a member names, or None for a whole tensor."""
    m = _SLICE.match(text)
    if m is None:
        return None
    rank = 2 if m.group("cols") else 1
    return SliceSpec(m.group("name"), int(m.group("a")), int(m.group("b")), rank)


def slice_member(name: str, dim: int, start: int, stop: int) -> str:
    """The written form of a column (``dim`` 1) or element (``dim`` 0) slice of a tensor."""
    return f"{name}[:, {start}:{stop}]" if dim == 1 else f"{name}[{start}:{stop}]"


def member_size(member: str, shapes: Mapping[str, Shape]) -> int:
    """Elements of one block member: a whole tensor, or its slice of the last dimension."""
    spec = parse_slice(member)
    if spec is None:
        return math.prod(shapes[member])
    full = shapes[spec.name]
    return math.prod(full[:-1]) * (spec.stop - spec.start)


def block_sizes(blocks: Mapping[str, Sequence[str]], shapes: Mapping[str, Shape]) -> dict[str, int]:
    """``{block: parameters}`` of blocks over parameters of these shapes."""
    return {name: sum(member_size(m, shapes) for m in members) for name, members in blocks.items()}


# --------------------------------------------------------------------------- reference models
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
_LAYER_ORDER = ("ln1", "q", "k", "v", "o", "ln2", "ffn_in", "ffn_out")


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


def _order_key(block: str) -> tuple[int, int, int, str]:
    if block == "embed":
        return (0, 0, 0, block)
    m = re.match(r"^layers\.(\d+)\.(.+)$", block)
    if m:
        sub = m.group(2)
        place = _LAYER_ORDER.index(sub) if sub in _LAYER_ORDER else 99
        return (1, int(m.group(1)), place, block)
    if block == "final_norm":
        return (2, 0, 0, block)
    if block == "head":
        return (3, 0, 0, block)
    return (4, 0, 0, block)


def ordered(blocks: dict[str, list[str]]) -> dict[str, list[str]]:
    """Blocks in the engine's order: ``embed``, the layers (sub-blocks in forward order),
    ``final_norm``, ``head``, then any other block by name. The reference model's
    ``named_parameters()`` come in this order, so it is the order its blocks appear in too."""
    return {b: blocks[b] for b in sorted(blocks, key=_order_key)}


def default_blocks(names: Iterable[str]) -> dict[str, list[str]]:
    """``{block name: [parameter names]}`` in the order the names come (engine contract)."""
    blocks: dict[str, list[str]] = {}
    for name in names:
        blocks.setdefault(default_block_of(name), []).append(name)
    return blocks


# --------------------------------------------------------------------------- Hugging Face models
GPT2_LAYER = re.compile(r"^(?:transformer\.)?h\.(\d+)\.(.+)\.(weight|bias)$")
GPT2_SUB = {
    "ln_1": "ln1",
    "attn.c_proj": "o",
    "ln_2": "ln2",
    "mlp.c_fc": "ffn_in",
    "mlp.c_proj": "ffn_out",
}
LLAMA_LAYER = re.compile(r"^(?:model\.)?layers\.(\d+)\.(.+)\.(weight|bias)$")
LLAMA_SUB = {
    "input_layernorm": "ln1",
    "self_attn.q_proj": "q",
    "self_attn.k_proj": "k",
    "self_attn.v_proj": "v",
    "self_attn.o_proj": "o",
    "post_attention_layernorm": "ln2",
    "mlp.gate_proj": "ffn_in",
    "mlp.up_proj": "ffn_in",
    "mlp.down_proj": "ffn_out",
}
TOP = {
    "wte": "embed",
    "wpe": "embed",
    "embed_tokens": "embed",
    "ln_f": "final_norm",
    "norm": "final_norm",
    "lm_head": "head",
}


def uniform_blocks(shapes: Mapping[str, Shape], model_type: str) -> dict[str, list[str]]:
    """The engine's uniform block ids over a Hugging Face model's parameters (name → shape,
    as ``named_parameters()`` gives them).

    ``embed``, ``layers.{i}.{ln1,q,k,v,o,ln2,ffn_in,ffn_out}``, ``final_norm``, ``head`` (absent
    with tied embeddings). GPT-2's fused ``attn.c_attn`` (``Conv1D``, weight (d, 3d)) is split
    into q, k, v column slices of the weight and element slices of the bias. A parameter no
    rule knows keeps a block named after its module path (nothing is silently dropped).
    """
    blocks: dict[str, list[str]] = {}
    for name, shape in shapes.items():
        if model_type == "gpt2":
            m = GPT2_LAYER.match(name)
            if m and m.group(2) == "attn.c_attn":
                layer, kind = m.group(1), m.group(3)
                width = shape[-1] // 3
                dim = 1 if kind == "weight" else 0
                for j, sub in enumerate(("q", "k", "v")):
                    member = slice_member(name, dim, j * width, (j + 1) * width)
                    blocks.setdefault(f"layers.{layer}.{sub}", []).append(member)
                continue
            sub_map = GPT2_SUB
        else:
            m = LLAMA_LAYER.match(name)
            sub_map = LLAMA_SUB
        if m:
            layer, sub = m.group(1), m.group(2)
            block = f"layers.{layer}.{sub_map.get(sub, sub)}"
        else:
            head = name.rpartition(".")[0]
            last = head.rpartition(".")[2]
            block = TOP.get(last, head or name)
        blocks.setdefault(block, []).append(name)
    return ordered(blocks)


# --------------------------------------------------------------------------- custom blocks
def custom_blocks(
    names: Sequence[str], patterns: Mapping[str, Sequence[str]]
) -> dict[str, list[str]]:
    """Blocks defined by parameter-name patterns: ``{"attn0": ["layers.0.attn.*"], ...}``.

    Each parameter may belong to at most one block; a pattern matching nothing is an error.
    A pattern written as a slice (``name[:, a:b]`` or ``name[a:b]``) is taken literally: that
    slice of the last dimension of the parameter (e.g. one of GPT-2's fused q/k/v).
    """
    names = list(names)
    owner: dict[str, str] = {}
    blocks: dict[str, list[str]] = {}
    for block, pats in patterns.items():
        members: list[str] = []
        for pat in pats:
            if parse_slice(pat) is not None:  # a literal slice member
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
        slices = [m for m in members if parse_slice(m) is not None]
        blocks[block] = [n for n in names if n in members] + slices
    return blocks


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


def selected_pairs(
    names: list[str], off_diagonal: bool | Sequence[Sequence[str]]
) -> list[tuple[str, str]]:
    """The off-diagonal pairs ``off_diagonal`` asks for among the selected blocks ``names``
    (every pair in block order when True); :class:`UnknownBlocks` for a pair naming others."""
    if off_diagonal is False:
        return []
    if off_diagonal is True:
        return [(a, b) for i, a in enumerate(names) for b in names[i + 1 :]]
    unknown = sorted({x for pair in off_diagonal for x in pair} - set(names))
    if unknown:
        raise UnknownBlocks(unknown)
    return [(a, b) for a, b in off_diagonal]
