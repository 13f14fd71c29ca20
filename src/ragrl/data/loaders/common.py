"""What every dataset loader shares: reading records from any file layout, typed field access whose
errors name the file, line/record and field, and the driver that turns records into ``Example``s.

File layouts (``read_records``):

* ``jsonl``        one JSON object per line (also a file holding a single JSON object);
* ``json-array``   a JSON array of objects; each record's error names its first line *and* its
                   0-based array index (``dev.json:57: JSON array item [3]: field 'question': missing``);
* ``json-columns`` pandas' column orientation ``{column: {row_label: value}}`` (``df.to_json()``);
                   errors name the row label;
* ``json-index``   pandas' index orientation ``{row_label: {column: value}}``;
* ``csv``          anything that is not JSON (only the Bamboogle loader reads it).
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ragrl.data.io import LoadReport, iter_jsonl, json_error, read_text, require_file
from ragrl.data.schema import Example
from ragrl.errors import DataError

_WS = re.compile(r"[ \t\n\r]*")


@dataclass(frozen=True, slots=True)
class Loc:
    """Where a record is: its file, first line (when known) and, for JSON containers, its index."""

    path: str
    line: int | None = None
    record: str | None = None

    def error(self, message: str, field: str | None = None) -> DataError:
        return DataError(message, path=self.path, line=self.line, field=field, record=self.record)

    def __str__(self) -> str:
        where = self.path + (f":{self.line}" if self.line is not None else "")
        return where + (f": {self.record}" if self.record else "")


Records = Iterator[tuple[Loc, Any]]


@dataclass
class RawFile:
    path: str
    layout: str
    records: Records


def _iter_json_array(text: str, path: str) -> Records:
    """Decode a JSON array item by item, tracking the line each item starts on."""
    decoder = json.JSONDecoder()
    i = _WS.match(text).end() + 1  # past "["
    line, last, n = 1, 0, 0
    try:
        while True:
            i = _WS.match(text, i).end()
            if i < len(text) and text[i] == "]":
                return
            if n:
                if i >= len(text) or text[i] != ",":
                    raise json.JSONDecodeError("Expecting ',' delimiter", text, i)
                i = _WS.match(text, i + 1).end()
            line += text.count("\n", last, i)
            last = i
            obj, i = decoder.raw_decode(text, i)
            yield Loc(path, line, f"JSON array item [{n}]"), obj
            n += 1
    except json.JSONDecodeError as e:
        raise DataError(json_error(e), path=path, line=e.lineno) from None


def _looks_like_record(obj: dict) -> bool:
    return any(k in obj and not isinstance(obj[k], dict) for k in ("question", "Question", "id", "_id"))


def _json_object_records(obj: dict, path: str) -> tuple[str, Records]:
    if _looks_like_record(obj):
        return "jsonl", iter([(Loc(path, 1), obj)])
    values = list(obj.values())
    if values and all(isinstance(v, dict) for v in values):
        if _looks_like_record(values[0]):  # {row_label: record}
            return "json-index", ((Loc(path, None, f"row {k!r}"), v) for k, v in obj.items())
        labels = list(dict.fromkeys(label for cells in values for label in cells))  # {column: {row: value}}

        def rows() -> Records:
            for label in labels:
                rec = {col: cells[label] for col, cells in obj.items() if label in cells}
                yield Loc(path, None, f"row {label!r}"), rec

        return "json-columns", rows()
    return "jsonl", iter([(Loc(path, 1), obj)])  # a single record of some other shape


def _iter_jsonl(p: Path) -> Records:
    for line, rec in iter_jsonl(p, on_error="yield"):
        yield Loc(str(p), line), rec


def _iter_csv(p: Path) -> Records:
    with p.open(encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f)
        start = 1
        for row in reader:
            yield Loc(str(p), start), row
            start = reader.line_num + 1


def read_records(path: str | Path) -> RawFile:
    """Open any supported file layout and iterate its records (see the module docstring)."""
    p = require_file(path)
    text = read_text(p, encoding="utf-8-sig")
    head = text.lstrip()[:1]
    spath = str(p)
    if not head:
        raise DataError("empty file", path=spath)
    if head == "[":
        return RawFile(spath, "json-array", _iter_json_array(text, spath))
    if head == "{":
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            if e.msg == "Extra data" or text.strip().count("\n") > 0:
                return RawFile(spath, "jsonl", _iter_jsonl(p))
            raise DataError(json_error(e), path=spath, line=e.lineno) from None
        layout, records = _json_object_records(obj, spath)
        return RawFile(spath, layout, records)
    return RawFile(spath, "csv", _iter_csv(p))


# --- typed field access -------------------------------------------------------------------------


def require_object(rec: Any, loc: Loc) -> dict[str, Any]:
    if not isinstance(rec, dict):
        raise loc.error(f"expected a JSON object, got {type(rec).__name__}")
    return rec


def get_str(rec: dict, key: str, loc: Loc, *, required: bool = True, non_empty: bool = False) -> str | None:
    if key not in rec or rec[key] is None:
        if required:
            raise loc.error("missing", key)
        return None
    value = rec[key]
    if not isinstance(value, str):
        raise loc.error(f"must be a string, got {type(value).__name__}", key)
    if non_empty and not value.strip():
        raise loc.error("must be a non-empty string", key)
    return value


def get_id(rec: dict, keys: tuple[str, ...], loc: Loc) -> str:
    for key in keys:
        if key in rec:
            value = rec[key]
            if isinstance(value, bool) or not isinstance(value, (str, int)) or str(value) == "":
                raise loc.error("must be a non-empty string or integer", key)
            return str(value)
    raise loc.error("missing", keys[0])


def get_str_list(rec: dict, key: str, loc: Loc) -> list[str]:
    value = rec.get(key)
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise loc.error("must be a list of strings", key)
    return value


def join_sentences(sentences: list[str]) -> str:
    """Join sentences into readable text: HotpotQA's carry their own leading space, 2Wiki's do not,
    so a single space is inserted only where neither side already has whitespace."""
    text = ""
    for s in sentences:
        if text and s and not s[:1].isspace() and not text[-1:].isspace():
            text += " "
        text += s
    return text


def dedupe(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


# --- the driver ---------------------------------------------------------------------------------


class NotARecord(Exception):
    """Raised by a converter for input that is not a record at all (a blank CSV row, a header row);
    the driver passes over it without counting it as skipped."""


@dataclass
class Context:
    """Per-file state a converter may use: warnings for the current record, and counters the
    format's ``finish`` turns into one summary warning (instead of one per record). Both hold the
    records that were kept: what a record counted goes into ``counters`` only once it is (a record
    skipped afterwards, a duplicate id, counts nothing)."""

    path: str
    source: str | None = None
    warnings: list[str] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)
    pending: dict[str, int] = field(default_factory=dict)

    def count(self, key: str) -> None:
        self.pending[key] = self.pending.get(key, 0) + 1

    def keep(self) -> None:
        """The current record is kept: its counts join the file's."""
        for key, n in self.pending.items():
            self.counters[key] = self.counters.get(key, 0) + n


Converter = Callable[[Any, Loc, Context], Example]


def run(
    raw: RawFile,
    convert: Converter,
    *,
    skip_invalid: bool,
    source: str | None,
    finish: Callable[[Context, LoadReport], None] | None = None,
) -> tuple[list[Example], LoadReport]:
    """Convert every record; a bad one raises ``DataError`` or, with ``skip_invalid``, is skipped
    and recorded in the report. Duplicate ids are errors (a canonical file could not hold them)."""
    report = LoadReport(raw.path)
    ctx = Context(raw.path, source)
    examples: list[Example] = []
    seen: dict[str, Loc] = {}
    for loc, rec in raw.records:
        ctx.warnings, ctx.pending = [], {}
        try:
            if isinstance(rec, DataError):
                raise rec
            try:
                ex = convert(rec, loc, ctx)
            except NotARecord:
                continue
            if ex.id in seen:
                raise loc.error(f"duplicate id {ex.id!r} (first at {seen[ex.id]})", "id")
        except DataError as e:
            if not skip_invalid:
                raise
            report.skipped.append(e)
            continue
        if source and "source" not in ex.metadata:
            ex.metadata["source"] = source
        seen[ex.id] = loc
        report.warnings.extend(ctx.warnings)
        ctx.keep()
        examples.append(ex)
    if finish is not None:
        finish(ctx, report)
    report.read = len(examples)
    return examples, report
