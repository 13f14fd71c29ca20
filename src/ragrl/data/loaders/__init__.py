"""Dataset loaders: every supported layout to canonical ``Example``s.

``load_dataset(path, format="auto")`` detects the dataset by the content of its first record (not by
the file name) and returns ``(examples, LoadReport)``. Each per-format loader (``load_hotpotqa``,
``load_2wiki``, ``load_musique``, ``load_bamboogle``, ``load_flashrag``) takes ``skip_invalid``: by
default the first malformed record raises ``DataError`` naming the file, line (and, for JSON
containers, the record index) and field; with ``skip_invalid=True`` it is skipped and listed in
``LoadReport.skipped``.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

from ragrl.data.io import LoadReport
from ragrl.data.loaders.common import RawFile, join_sentences, read_records, run
from ragrl.data.loaders.multihop import convert_multihop, finish_multihop, is_twowiki
from ragrl.data.loaders.musique import convert_musique, finish_musique, is_musique
from ragrl.data.loaders.simple import (
    BamboogleCsv,
    BamboogleJson,
    convert_flashrag,
    finish_flashrag,
    is_bamboogle_json,
    is_flashrag,
)
from ragrl.data.schema import Example
from ragrl.errors import RagrlError

FORMATS = ("hotpotqa", "2wiki", "musique", "bamboogle", "flashrag")
ALIASES = {
    "canonical": "flashrag",
    "hotpot": "hotpotqa",
    "2wikimultihopqa": "2wiki",
    "2wikimultihop": "2wiki",
    "musique-ans": "musique",
}
# metadata["source"] written for each format (FlashRAG files keep their own, if any).
SOURCE_NAMES = {
    "hotpotqa": "hotpotqa",
    "2wiki": "2wikimultihopqa",
    "musique": "musique",
    "bamboogle": "bamboogle",
    "flashrag": None,
}
# An explicit --format accepts files detected as any of these.
_COMPATIBLE = {
    "hotpotqa": {"hotpotqa", "2wiki"},
    "2wiki": {"hotpotqa", "2wiki"},
    "musique": {"musique"},
    "bamboogle": {"bamboogle", "flashrag"},
    "flashrag": {"flashrag"},
}

Result = tuple[list[Example], LoadReport]


def normalize_format(fmt: str) -> str:
    name = ALIASES.get(fmt.lower(), fmt.lower())
    if name != "auto" and name not in FORMATS:
        raise RagrlError(f"unknown format {fmt!r}; choose one of: auto, {', '.join(FORMATS)} (or canonical)")
    return name


def _peek(raw: RawFile, *, strict: bool = True) -> tuple[Any, RawFile]:
    """The first record that is an object (or CSV row), and the file with nothing consumed. When there
    is none and ``strict``, the first bad record's error is raised (it says more than "no records")."""
    head: list[Any] = []
    first = None
    for item in raw.records:
        head.append(item)
        rec = item[1]
        if isinstance(rec, dict) or (isinstance(rec, list) and raw.layout == "csv" and any(rec)):
            first = rec
            break
    if first is None and strict:  # nothing readable: the first bad record says why
        errors = [item[1] for item in head if isinstance(item[1], RagrlError)]
        if errors:
            raise errors[0]
    return first, RawFile(raw.path, raw.layout, itertools.chain(head, raw.records))


def detect_record_format(rec: Any, layout: str) -> str | None:
    """The dataset a first record belongs to, or None when it matches nothing known."""
    if layout == "csv":
        return "bamboogle" if isinstance(rec, list) and len(rec) >= 5 else None
    if not isinstance(rec, dict):
        return None
    if is_flashrag(rec):
        return "flashrag"
    if is_bamboogle_json(rec):
        return "bamboogle"
    if is_musique(rec):
        return "musique"
    if "supporting_facts" in rec or "context" in rec or ("answer" in rec and ("_id" in rec or "type" in rec)):
        return "2wiki" if is_twowiki(rec) else "hotpotqa"
    return None


def detect_format(path: str | Path) -> str:
    """Which of ``FORMATS`` a file holds, judged by its content."""
    raw = read_records(path)
    first, _ = _peek(raw)
    return _detect_or_fail(raw, first)


def _detect_or_fail(raw: RawFile, first: Any) -> str:
    fmt = detect_record_format(first, raw.layout)
    if fmt is None:
        if first is None:
            raise RagrlError(f"{raw.path}: no records to tell the format from")
        if isinstance(first, dict):
            shown = [str(k) if str(k).isidentifier() else json.dumps(str(k)) for k in list(first)[:10]]
            keys = ", ".join(shown)  # an odd key is quoted and escaped: the message stays one line
        else:
            keys = f"{len(first)} CSV columns"
        hint = ""
        if isinstance(first, dict) and ("contents" in first or "text" in first) and "question" not in first:
            hint = " It looks like a passage corpus, not a question file."
        raise RagrlError(
            f"{raw.path}: cannot tell the dataset format (first record: {keys}).{hint} Supported formats: "
            f"{', '.join(FORMATS)} (canonical = flashrag). Pass --format to choose one."
        )
    return fmt


def load_dataset(
    path: str | Path, format: str = "auto", skip_invalid: bool = False, *, source: str | None = None
) -> Result:
    """Load any supported dataset file as canonical examples (see the module docstring).

    ``source`` overrides the ``metadata["source"]`` written for every example (FlashRAG files have
    none unless their records carry one).
    """
    fmt = normalize_format(format)
    raw = read_records(path)
    first, raw = _peek(raw, strict=fmt == "auto" or not skip_invalid)
    detected = detect_record_format(first, raw.layout)
    if fmt == "auto":
        fmt = _detect_or_fail(raw, first)
    elif detected is not None and detected not in _COMPATIBLE[fmt]:
        raise RagrlError(f"{raw.path}: looks like {detected}, not {fmt}; use --format {detected} or auto")
    src = source or SOURCE_NAMES[fmt]

    finish = None
    if fmt in ("hotpotqa", "2wiki"):
        converter: Any = convert_multihop
        finish = finish_multihop
    elif fmt == "musique":
        converter, finish = convert_musique, finish_musique
    elif fmt != "bamboogle":
        converter, finish = convert_flashrag, finish_flashrag
    elif raw.layout == "csv":
        converter = BamboogleCsv()
    elif detected == "flashrag":
        converter, finish = convert_flashrag, finish_flashrag
    else:
        converter = BamboogleJson()
    examples, report = run(raw, converter, skip_invalid=skip_invalid, source=src, finish=finish)
    report.format = fmt
    return examples, report


def load_hotpotqa(path: str | Path, *, skip_invalid: bool = False) -> Result:
    """HotpotQA, original list layout (JSON array or jsonl) or Hugging Face dict layout."""
    return load_dataset(path, "hotpotqa", skip_invalid)


def load_2wiki(path: str | Path, *, skip_invalid: bool = False) -> Result:
    """2WikiMultiHopQA: original JSON array, pandas column JSON, or the no-context variant."""
    return load_dataset(path, "2wiki", skip_invalid)


def load_musique(path: str | Path, *, skip_invalid: bool = False) -> Result:
    """MuSiQue jsonl (with paragraphs) or the JSON array without paragraphs."""
    return load_dataset(path, "musique", skip_invalid)


def load_bamboogle(path: str | Path, *, skip_invalid: bool = False) -> Result:
    """Bamboogle: headerless CSV, comp-gap JSON with decompositions, or FlashRAG jsonl."""
    return load_dataset(path, "bamboogle", skip_invalid)


def load_flashrag(path: str | Path, *, skip_invalid: bool = False, source: str | None = None) -> Result:
    """FlashRAG jsonl (NQ, TriviaQA, PopQA, ...) and ragrl's own canonical question files."""
    return load_dataset(path, "flashrag", skip_invalid, source=source)


__all__ = [
    "FORMATS",
    "detect_format",
    "join_sentences",
    "load_2wiki",
    "load_bamboogle",
    "load_dataset",
    "load_flashrag",
    "load_hotpotqa",
    "load_musique",
    "normalize_format",
]
