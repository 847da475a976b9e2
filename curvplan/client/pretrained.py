"""Read a ``save_pretrained`` directory as the service takes it: config inline, shard files.

A directory written by ``model.save_pretrained(out)`` (``transformers``) holds ``config.json``
and either ``model.safetensors`` or shards ``model-0000i-of-0000n.safetensors`` listed in
``model.safetensors.index.json`` (``weight_map``: tensor name → shard file). The client reads
both itself, checks the config with the service's own rules (so a refused model fails before
gigabytes are uploaded) and checks every shard's header against the index (a stale or missing
shard is named here, not after an upload). No torch, no ``transformers``: only the safetensors
header (8-byte length + JSON) is read.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypedDict

from pydantic import JsonValue

from curvplan.types.huggingface import HFConfigError, parse_hf_config

CONFIG_FILE = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
_MAX_HEADER_BYTES = 100 * 1024 * 1024


class PretrainedDirError(ValueError):
    """The directory is not a usable ``save_pretrained`` directory; the message says why."""


class HuggingFaceModelJson(TypedDict):
    """The ``model`` field of a request for a Hugging Face model
    (``curvplan.types.huggingface.HuggingFaceModel``)."""

    source: Literal["huggingface"]
    config: dict[str, JsonValue]


@dataclass(frozen=True)
class PretrainedDir:
    """A checked ``save_pretrained`` directory: its config and its shard files, in order."""

    path: Path
    config: dict[str, JsonValue]  # config.json as read: free-form JSON
    shards: tuple[Path, ...]

    @property
    def model(self) -> HuggingFaceModelJson:
        """The ``model`` field of an analyze request for this directory."""
        return {"source": "huggingface", "config": self.config}


def is_pretrained_dir(value: Any) -> bool:
    """Whether ``value`` is a path (str or PathLike) of a directory holding a config.json."""
    if not isinstance(value, str | os.PathLike):
        return False
    path = Path(value)
    return path.is_dir() and (path / CONFIG_FILE).is_file()


def read_pretrained(path: str | os.PathLike[str]) -> PretrainedDir:
    """Read and check ``path`` (module docstring); :class:`PretrainedDirError` if unusable."""
    root = Path(path)
    if not root.is_dir():
        raise PretrainedDirError(f"{root}: not a directory (expected a save_pretrained directory)")
    config = _read_json(root / CONFIG_FILE)
    if not isinstance(config, dict):
        raise PretrainedDirError(f"{root / CONFIG_FILE}: must be a JSON object")
    try:
        parse_hf_config(config)
    except HFConfigError as exc:
        raise PretrainedDirError(f"{root / CONFIG_FILE}: {exc}") from None
    if (root / INDEX_FILE).is_file():
        shards = _indexed_shards(root)
    elif (root / SINGLE_FILE).is_file():
        shards = (root / SINGLE_FILE,)
        _header(shards[0])
    else:
        found = sorted(p.name for p in root.iterdir() if p.suffix in (".bin", ".pt", ".pth"))
        hint = (
            f" (found {', '.join(found)}: re-save with save_pretrained(..., "
            "safe_serialization=True); pickled weights are never loaded)"
            if found
            else ""
        )
        raise PretrainedDirError(f"{root}: no {SINGLE_FILE} and no {INDEX_FILE}{hint}")
    return PretrainedDir(root, config, shards)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise PretrainedDirError(f"{path}: not found") from None
    except (OSError, ValueError) as exc:
        raise PretrainedDirError(f"{path}: cannot read JSON: {exc}") from None


def _indexed_shards(root: Path) -> tuple[Path, ...]:
    index = _read_json(root / INDEX_FILE)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise PretrainedDirError(f"{root / INDEX_FILE}: needs a non-empty 'weight_map' object")
    by_shard: dict[str, set[str]] = {}
    for tensor, shard in weight_map.items():
        if not isinstance(shard, str) or Path(shard).name != shard or shard in ("", ".", ".."):
            raise PretrainedDirError(
                f"{root / INDEX_FILE}: tensor {tensor!r} maps to {shard!r}, not a file name "
                "in the directory"
            )
        by_shard.setdefault(shard, set()).add(tensor)
    shards = []
    for shard in sorted(by_shard):
        path = root / shard
        if not path.is_file():
            missing = sorted(by_shard[shard])
            raise PretrainedDirError(
                f"{path}: shard named by {INDEX_FILE} is missing (it holds "
                f"{', '.join(missing[:5])}{' …' if len(missing) > 5 else ''})"
            )
        names = _header(path)
        if names != by_shard[shard]:
            absent = sorted(by_shard[shard] - names)
            extra = sorted(names - by_shard[shard])
            parts = []
            if absent:
                parts.append(f"missing {', '.join(absent)}")
            if extra:
                parts.append(f"not in the index: {', '.join(extra)}")
            raise PretrainedDirError(
                f"{path} does not hold what {INDEX_FILE} says: {'; '.join(parts)}"
            )
        shards.append(path)
    return tuple(shards)


def _header(path: Path) -> set[str]:
    """Tensor names in a safetensors file's header."""
    return set(header_shapes(path))


def header_shapes(path: Path) -> dict[str, list[int]]:
    """Tensor name → shape in a safetensors file's header (the data is not read)."""
    try:
        with path.open("rb") as fh:
            raw = fh.read(8)
            if len(raw) != 8:
                raise PretrainedDirError(f"{path}: not a safetensors file (too short)")
            (length,) = struct.unpack("<Q", raw)
            if length > _MAX_HEADER_BYTES:
                raise PretrainedDirError(f"{path}: not a safetensors file (header too large)")
            header = json.loads(fh.read(length))
    except OSError as exc:
        raise PretrainedDirError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except ValueError:
        raise PretrainedDirError(f"{path}: not a safetensors file (bad header)") from None
    if not isinstance(header, dict):
        raise PretrainedDirError(f"{path}: not a safetensors file (bad header)")
    return {
        name: list(entry.get("shape") or []) if isinstance(entry, dict) else []
        for name, entry in header.items()
        if name != "__metadata__"
    }


def checkpoint_shapes(pretrained: PretrainedDir) -> dict[str, list[int]]:
    """Tensor name → shape over every shard of a ``save_pretrained`` directory."""
    shapes: dict[str, list[int]] = {}
    for shard in pretrained.shards:
        shapes.update(header_shapes(shard))
    return shapes
