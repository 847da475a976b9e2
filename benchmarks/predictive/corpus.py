"""Real text for the predictive benchmark: the English prose of the Perl documentation that the
system Perl ships (``/usr/share/perl/5.*``: its ``.pod`` files and the POD of its ``.pm``
modules), stripped of POD markup, lower-cased, character level, split BY DOCUMENT.

Nothing here is synthetic and nothing was written by this project: the files come with the
Debian ``perl-modules`` package every machine of this kind has. Verbatim paragraphs (indented:
code samples) are dropped, ordinary paragraphs and headings are kept, formatting codes
(``B<…>``, ``C<< … >>``, ``L<text|target>`` …) are replaced by their text.

An example is a window of ``seq_len + 1`` consecutive characters of one document (inputs = the
first ``seq_len``, targets = the next character at each position); windows do not overlap and
never cross documents, so every example carries its document as ``group``.
"""

from __future__ import annotations

import glob
import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

PERL_ROOTS = ("/usr/share/perl/5.*",)
ALPHABET = "\n abcdefghijklmnopqrstuvwxyz0123456789.,;:!?'\"()[]{}<>-_/\\$@%&*=+#|~`^"
UNKNOWN = "\x00"  # every other character (accents, tabs, …) maps to one id
VOCAB = ALPHABET + UNKNOWN
_CODE_SIMPLE = re.compile(r"([A-Z])<([^<>]*)>")
_CODE_MULTI = re.compile(r"([A-Z])(<{2,})\s+(.*?)\s+(>{2,})", re.DOTALL)
_ENTITIES = {"lt": "<", "gt": ">", "sol": "/", "verbar": "|", "quot": '"', "amp": "&"}


def _link_text(body: str) -> str:
    """L<text|name/"sec">, L<name>, L</"sec">, L<name/sec> → the words a reader sees."""
    if "|" in body:
        return body.split("|", 1)[0]
    body = body.replace('"', "")
    if body.startswith("/"):
        return body[1:]
    return body.replace("/", " ")


def _replace_code(letter: str, body: str) -> str:
    if letter in ("X", "Z"):
        return ""
    if letter == "E":
        name = body.strip()
        if name in _ENTITIES:
            return _ENTITIES[name]
        if name.isdigit():
            return chr(int(name)) if int(name) < 128 else UNKNOWN
        return UNKNOWN
    if letter == "L":
        return _link_text(body)
    return body


def strip_formatting(text: str) -> str:
    """Replace POD formatting codes by their text (innermost first; ``C<< … >>`` forms)."""

    def multi(m: re.Match[str]) -> str:
        if len(m.group(2)) != len(m.group(4)):
            return m.group(0)
        return _replace_code(m.group(1), m.group(3))

    text = _CODE_MULTI.sub(multi, text)
    previous = None
    while previous != text:
        previous = text
        text = _CODE_SIMPLE.sub(lambda m: _replace_code(m.group(1), m.group(2)), text)
    return text


def pod_prose(source: str) -> str:
    """The prose of a POD document (or of the POD blocks of a Perl module): headings, items
    and ordinary paragraphs, one paragraph a line; code, verbatim blocks and ``=begin`` …
    ``=end`` / ``=for`` regions are dropped."""
    out: list[str] = []
    in_pod = source.lstrip().startswith("=")
    skip_region = 0
    for para in re.split(r"\n[ \t]*\n", source):
        if not para.strip():
            continue
        first = para.lstrip("\n")
        if first.startswith("="):
            match = re.match(r"=(\w+)\s*(.*)", first, re.DOTALL)
            command, rest = (match.group(1), match.group(2)) if match else ("", "")
            if command == "cut":
                in_pod = False
                continue
            in_pod = True
            if command == "begin":
                skip_region += 1
            elif command == "end":
                skip_region = max(0, skip_region - 1)
            elif (
                (command.startswith("head") or command == "item")
                and not skip_region
                and rest.strip() not in ("", "*", "-")
            ):
                out.append(rest)
            continue  # =for, =over, =back, =encoding, =pod: no prose
        if not in_pod or skip_region:
            continue
        if first[:1] in (" ", "\t"):
            continue  # verbatim: code
        out.append(first)
    lines = []
    for para in out:
        words = " ".join(strip_formatting(para).split())
        if words:
            lines.append(words)
    return "\n".join(lines) + ("\n" if lines else "")


def encode(text: str) -> np.ndarray:
    """Lower-case characters → ids in VOCAB (unknown characters share one id)."""
    table = {c: i for i, c in enumerate(VOCAB)}
    unknown = table[UNKNOWN]
    return np.fromiter((table.get(c, unknown) for c in text.lower()), dtype=np.int64)


@dataclass
class Document:
    path: str
    sha256: str
    prose_chars: int
    ids: np.ndarray = field(repr=False)


def find_documents(roots: tuple[str, ...] = PERL_ROOTS, min_chars: int = 400) -> list[Document]:
    """Every ``.pod`` file and every ``.pm`` module with POD under ``roots`` (sorted paths,
    identical files once), with at least ``min_chars`` characters of prose."""
    paths: list[Path] = []
    for pattern in roots:
        for root in sorted(glob.glob(pattern)):
            base = Path(root)
            if base.is_symlink() or not base.is_dir():
                continue
            paths += sorted(p for p in base.rglob("*") if p.suffix in (".pod", ".pm"))
    docs: list[Document] = []
    seen: set[str] = set()
    for path in paths:
        raw = path.read_bytes()
        digest = hashlib.sha256(raw).hexdigest()
        if digest in seen:
            continue
        seen.add(digest)
        text = pod_prose(raw.decode("utf-8", errors="replace"))
        if len(text) < min_chars:
            continue
        docs.append(Document(str(path), digest, len(text), encode(text)))
    return docs


@dataclass
class Split:
    """Training and validation examples, split by document."""

    train_x: np.ndarray
    train_y: np.ndarray
    train_groups: np.ndarray
    val_x: np.ndarray
    val_y: np.ndarray
    val_groups: np.ndarray
    train_docs: list[Document]
    val_docs: list[Document]

    def manifest(self) -> dict:
        """The file list with sha256 hashes and example counts, for the results file."""

        def rows(docs: list[Document], groups: np.ndarray, offset: int) -> list[dict]:
            counts = np.bincount(groups - offset, minlength=len(docs))
            return [
                {
                    "path": d.path,
                    "sha256": d.sha256,
                    "prose_chars": d.prose_chars,
                    "examples": int(counts[i]),
                }
                for i, d in enumerate(docs)
            ]

        return {
            "train": rows(self.train_docs, self.train_groups, 0),
            "validation": rows(self.val_docs, self.val_groups, len(self.train_docs)),
        }


def windows(ids: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Non-overlapping windows of ``seq_len + 1`` ids: (inputs, next-character targets)."""
    n = len(ids) // (seq_len + 1)
    block = ids[: n * (seq_len + 1)].reshape(n, seq_len + 1)
    return block[:, :-1].copy(), block[:, 1:].copy()


def split_by_document(docs: list[Document], seq_len: int, validation_every: int = 7) -> Split:
    """Documents ordered by content hash; every ``validation_every``-th is a validation
    document, the rest train. No document contributes to both sides."""
    ordered = sorted(docs, key=lambda d: d.sha256)
    val_docs = [d for i, d in enumerate(ordered) if i % validation_every == 0]
    train_docs = [d for i, d in enumerate(ordered) if i % validation_every != 0]

    def build(chosen: list[Document], offset: int) -> tuple[np.ndarray, ...]:
        xs, ys, gs = [], [], []
        for j, d in enumerate(chosen):
            x, y = windows(d.ids, seq_len)
            xs.append(x)
            ys.append(y)
            gs.append(np.full(len(x), offset + j, dtype=np.int64))
        return np.concatenate(xs), np.concatenate(ys), np.concatenate(gs)

    tx, ty, tg = build(train_docs, 0)
    vx, vy, vg = build(val_docs, len(train_docs))
    return Split(tx, ty, tg, vx, vy, vg, train_docs, val_docs)
