"""Reading and writing canonical files, with errors that name the file, line and field.

``read_examples`` and ``read_corpus`` either stop at the first bad record (the default) or, with
``skip_invalid=True``, skip it and return it in a ``LoadReport`` so the caller can say how many were
skipped and why. Nothing is ever dropped without being reported.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ragrl.data.schema import Example, Passage
from ragrl.errors import DataError, RagrlError

CANONICAL_FIELDS = frozenset({"id", "question", "golden_answers", "metadata"})
"""The fields of a canonical question record (FlashRAG jsonl); whatever else a record holds goes under
``metadata``."""


def not_kept(path: str | Path, key: str, records: int, where: str = "") -> str:
    """The warning for a field outside ``CANONICAL_FIELDS``, which a canonical question record drops."""
    return (
        f"{path}: field {key!r} is not part of a canonical record (id, question, golden_answers, "
        f"metadata) and is not kept ({records} records{', ' + where if where else ''}); put it under "
        "metadata to keep it"
    )


SHOWN_PLACES = 10
"""How many skipped records a summary line names (the others are counted)."""


@dataclass
class LoadReport:
    """What a loader read, skipped and could not resolve."""

    path: str
    read: int = 0
    format: str | None = None
    """The dataset layout the records were read as (set by ``load_dataset``)."""
    skipped: list[DataError] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def summary(self) -> str:
        lines = [f"{self.path}: read {self.read} records, skipped {len(self.skipped)}"]
        where: dict[str, list[str]] = {}  # each reason: its records' lines (or names, without a line)
        for e in self.skipped:
            reason = f"field '{e.field}': {e.message}" if e.field else e.message
            where.setdefault(reason, []).append(f"line {e.line}" if e.line is not None else (e.record or "?"))
        for reason, places in sorted(where.items(), key=lambda item: -len(item[1])):
            more = len(places) - SHOWN_PLACES
            shown = ", ".join(places[:SHOWN_PLACES]) + (f", and {more} more" if more > 0 else "")
            lines.append(f"  skipped {len(places)} x {reason} ({shown})")
        if self.warnings:
            lines += [f"  warning: {w}" for w in self.warnings[:SHOWN_PLACES]]
            if len(self.warnings) > SHOWN_PLACES:
                lines.append(f"  and {len(self.warnings) - SHOWN_PLACES} more warnings")
        return "\n".join(lines)


def require_file(path: str | Path) -> Path:
    """``path`` as a ``Path``, or a ``RagrlError`` saying it is missing or a directory."""
    p = Path(path)
    if not p.exists():
        raise RagrlError(f"{p}: no such file")
    if p.is_dir():
        raise RagrlError(f"{p}: is a directory, expected a file")
    return p


_GZIP_MAGIC = b"\x1f\x8b"


def _not_text(p: Path, data: bytes) -> DataError | None:
    """Why the bytes of ``p`` are not a text file we can read, or None."""
    if data.startswith(_GZIP_MAGIC):
        return DataError("a gzip-compressed file: decompress it first (gunzip)", path=p)
    return None


def _undecodable(p: Path, line: int, raw_line: bytes, bad: int) -> DataError:
    """The error for byte ``bad`` of ``raw_line`` (line ``line`` of ``p``); the column counts characters."""
    column = len(raw_line[:bad].decode("utf-8", "replace")) + 1
    return DataError(
        f"not UTF-8 text (byte 0x{raw_line[bad]:02x} at column {column}); convert the file to UTF-8",
        path=p,
        line=line,
    )


def read_text(path: str | Path, *, encoding: str = "utf-8") -> str:
    """The whole text of a file; a missing file, a compressed file or bytes that are not UTF-8 are a
    ``RagrlError`` / ``DataError`` naming the file (and the line and column of the first bad byte)."""
    p = require_file(path)
    data = p.read_bytes()
    bad = _not_text(p, data)
    if bad is not None:
        raise bad
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as e:
        pos = e.start + (len(data) - len(e.object))  # utf-8-sig reports offsets after the BOM
        start = data.rfind(b"\n", 0, pos) + 1
        end = data.find(b"\n", pos)
        raw_line = data[start : end if end >= 0 else len(data)]
        raise _undecodable(p, data.count(b"\n", 0, pos) + 1, raw_line, pos - start) from None


def iter_jsonl(path: str | Path, *, on_error: str = "raise") -> Iterator[tuple[int, Any]]:
    """Yield ``(line_number, parsed_json)`` for every non-blank line (line numbers start at 1).

    A line that is not valid JSON, or not UTF-8, raises ``DataError`` naming the file and line; with
    ``on_error="yield"`` the ``DataError`` is yielded in place of the record and reading goes on. A
    gzip-compressed file is refused at once. Lines may end in ``\n`` or ``\r\n``; a file without any
    ``\n`` is read as ``\r``-separated (classic Mac files).
    """
    p = require_file(path)
    with p.open("rb") as f:
        bad = _not_text(p, f.read(2))
        if bad is not None:
            raise bad
        f.seek(0)
        for lineno, raw in enumerate(_lines(f), start=1):
            if lineno == 1 and raw.startswith(codecs.BOM_UTF8):  # a BOM some editors write
                raw = raw[len(codecs.BOM_UTF8) :]
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                err = _undecodable(p, lineno, raw, e.start)
                if on_error != "yield":
                    raise err from None
                yield lineno, err
                continue
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as e:
                err = DataError(json_error(e), path=p, line=lineno)
                if on_error != "yield":
                    raise err from None
                yield lineno, err


def _lines(f: Any) -> Iterator[bytes]:
    """The lines of a binary file, each without its ending (``\n`` or ``\r\n``). A file with no ``\n``
    at all is split on ``\r`` (classic Mac line endings); elsewhere a ``\r`` inside a line is left
    alone (JSON allows it as whitespace)."""
    for i, raw in enumerate(f):
        if i == 0 and not raw.endswith(b"\n") and b"\r" in raw.rstrip(b"\r"):
            yield from raw.rstrip(b"\r").split(b"\r")  # the whole file, one "line": CR endings
            return
        body = raw[:-1] if raw.endswith(b"\n") else raw
        yield body[:-1] if body.endswith(b"\r") else body


def json_error(e: json.JSONDecodeError) -> str:
    """``invalid JSON (<reason> at column N)`` for a decode error. Some of json's reasons end in "at"
    ("Invalid control character at"); that word is dropped so the message never reads "at at"."""
    reason = e.msg.removesuffix(" at")
    return f"invalid JSON ({reason} at column {e.colno})"


def write_jsonl(path: str | Path, records: Iterable[dict[str, Any]]) -> int:
    """Write records as jsonl atomically (a temp file renamed into place); returns the count."""
    n = 0

    def write(f: Any) -> None:
        nonlocal n
        for rec in records:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
            n += 1

    atomic_write(path, write, "w")
    return n


def atomic_write(path: str | Path, write: Callable[[Any], None], mode: str = "wb") -> None:
    """``write(f)`` into a temporary file beside ``path``, given the usual permissions and renamed into
    place: a reader sees the old file or the whole new one, never a part; a failure leaves no trace."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    except PermissionError as e:  # named as the file asked for, not the temporary one beside it
        raise PermissionError(e.errno, e.strerror, str(p)) from None
    try:
        with os.fdopen(fd, mode, **({"encoding": "utf-8"} if "b" not in mode else {})) as f:
            write(f)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the usual permissions
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def same_file(fd: int, path: str | Path) -> bool:
    """Whether ``path`` names the file open as ``fd`` (the same inode)."""
    try:
        other = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (mine.st_dev, mine.st_ino) == (other.st_dev, other.st_ino)


def save_open_file(fd: int, path: Path, size: int, target: Path) -> None:
    """The file open as ``fd`` (first opened at ``path``, ``size`` bytes) at ``target``, replacing what
    is there only once it is whole: a hard link where the file system allows it and ``path`` still
    names it (no copy of gigabytes), else a copy read from ``fd``."""
    if same_file(fd, target):
        return
    tmp = target.parent / f".{target.name}.{os.getpid()}.tmp"
    tmp.unlink(missing_ok=True)
    try:
        try:
            os.link(path, tmp)
            if not same_file(fd, tmp):  # the path names another file now: copy from ours
                raise OSError
        except OSError:
            tmp.unlink(missing_ok=True)
            _copy_from(fd, size, tmp, path)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _copy_from(fd: int, size: int, target: Path, path: Path) -> None:
    done = 0
    with target.open("wb") as f:
        while done < size:
            data = os.pread(fd, min(1 << 24, size - done), done)
            if not data:
                raise RagrlError(f"{path}: the file shrank to {done} bytes while it was copied")
            f.write(data)
            done += len(data)


def read_examples(path: str | Path, *, skip_invalid: bool = False) -> tuple[list[Example], LoadReport]:
    """Read a canonical question file (FlashRAG jsonl)."""
    report = LoadReport(str(path))
    examples: list[Example] = []
    seen: dict[str, int] = {}
    extra: dict[str, tuple[int, int]] = {}  # a field outside the canonical record: records, first line
    for lineno, record in iter_jsonl(path, on_error="yield"):
        try:
            if isinstance(record, DataError):
                raise record
            ex = Example.from_record(record, path=str(path), line=lineno)
            if ex.id in seen:
                raise DataError(
                    f"duplicate id {ex.id!r} (first on line {seen[ex.id]})",
                    path=path,
                    line=lineno,
                    field="id",
                )
        except DataError as e:
            if not skip_invalid:
                raise
            report.skipped.append(e)
            continue
        seen[ex.id] = lineno
        examples.append(ex)
        if not record.keys() <= CANONICAL_FIELDS:
            for key in record.keys() - CANONICAL_FIELDS:
                count, first = extra.get(key, (0, lineno))
                extra[key] = (count + 1, first)
    for key, (count, first) in extra.items():  # a field a canonical record has no place for: said so
        report.warnings.append(not_kept(path, key, count, f"first on line {first}"))
    report.read = len(examples)
    return examples, report


def write_examples(path: str | Path, examples: Iterable[Example]) -> int:
    return write_jsonl(path, (ex.to_record() for ex in examples))


def _passage_from_record(record: Any, path: str, line: int) -> Passage:
    """A corpus record's passage; a record with neither a title nor a text is refused: it could never
    be found by its words, and a dense index would hand an empty passage to the agent."""
    passage = _passage_fields(record, path, line)
    if passage.empty:
        field = "contents" if "contents" in record else "text"
        raise DataError("empty passage (no title and no text)", path=path, line=line, field=field)
    return passage


def _passage_fields(record: Any, path: str, line: int) -> Passage:
    if not isinstance(record, dict):
        raise DataError(f"expected a JSON object, got {type(record).__name__}", path=path, line=line)
    if "contents" in record:
        if "id" not in record:
            raise DataError("missing", path=path, line=line, field="id")
        if not isinstance(record["contents"], str):
            raise DataError("must be a string", path=path, line=line, field="contents")
        title = record.get("title")
        if title is not None and not isinstance(title, str):
            raise DataError("must be a string", path=path, line=line, field="title")
        return Passage.from_contents(str(record["id"]), record["contents"], title)
    if "text" in record:
        if not isinstance(record["text"], str):
            raise DataError("must be a string", path=path, line=line, field="text")
        title = record.get("title", "")
        if not isinstance(title, str):
            raise DataError("must be a string", path=path, line=line, field="title")
        if "id" in record:
            return Passage(str(record["id"]), title.strip(), record["text"].strip())
        return Passage.make(title, record["text"])
    raise DataError(
        "missing (a corpus record needs 'contents' or 'text')", path=path, line=line, field="contents"
    )


def read_corpus(path: str | Path, *, skip_invalid: bool = False) -> tuple[list[Passage], LoadReport]:
    """Read a corpus: canonical jsonl ``{id, contents}`` (or ``{id, title, text}``), or a JSON array
    of ``{title, text}`` objects (HippoRAG style; ids are then derived from the content).

    Duplicate ids with the same content are merged; the same id with different content is an error.
    """
    reports: list[LoadReport] = []
    passages = list(iter_corpora([path], reports, skip_invalid=skip_invalid))
    return passages, reports[0]


def read_corpora(paths: Iterable[str | Path]) -> tuple[list[Passage], list[LoadReport]]:
    """Read several corpus files and merge them by passage id (first-seen order).

    The same id with different contents in two files is a ``DataError`` naming the later file.
    """
    reports: list[LoadReport] = []
    return list(iter_corpora(paths, reports)), reports


def iter_corpora(
    paths: Iterable[str | Path], reports: list[LoadReport] | None = None, *, skip_invalid: bool = False
) -> Iterator[Passage]:
    """The passages of several corpus files merged by id, streamed: what ``read_corpora`` returns,
    one passage at a time (a jsonl file is never held whole; a JSON array file is). It keeps each id
    and a 6-byte digest of its title and text (~140 bytes a passage: ~300 MB for 2M), not the
    passages, to merge repeats and refuse conflicts. Each file's ``LoadReport`` is appended to
    ``reports`` when the file is done."""
    seen: dict[str, int] = {}  # id -> (contents digest << 16) | number of the file it was last seen in
    for number, path in enumerate(paths):
        p = require_file(path)
        report = LoadReport(str(p))
        read = 0
        for n, where, passage in _corpus_records(p, report, skip_invalid):
            # title and text apart, not contents: "a\nb" + "c" is not "a" + "b\nc"
            content = json.dumps([passage.title, passage.text]).encode()
            digest = int.from_bytes(hashlib.blake2b(content, digest_size=6).digest(), "big")
            mark = (digest << 16) | (number & 0xFFFF)
            old = seen.get(passage.id)
            if old is None:
                seen[passage.id] = mark
                read += 1
                yield passage
                continue
            same_file = (old & 0xFFFF) == (number & 0xFFFF)
            if old >> 16 != digest:
                if same_file:
                    e = DataError(
                        f"duplicate id {passage.id!r} with different contents",
                        path=p, line=n if where == "line" else None, field="id",
                    )  # fmt: skip
                    if not skip_invalid:
                        raise e
                    report.skipped.append(e)
                    continue
                raise DataError(
                    f"passage id {passage.id!r} has different contents in an earlier corpus file",
                    path=p, line=n if where == "line" else None, field="id",
                )  # fmt: skip
            if same_file:
                report.warnings.append(f"{where} {n}: duplicate of passage {passage.id}, merged")
            else:
                read += 1  # counted in this file too, kept once
                seen[passage.id] = mark  # a repeat later in this file is then this file's duplicate
        report.read = read
        if reports is not None:
            reports.append(report)


def _corpus_records(p: Path, report: LoadReport, skip_invalid: bool) -> Iterator[tuple[int, str, Passage]]:
    """``(line or item number, "line" | "item", passage)`` of one corpus file; invalid records raise,
    or with ``skip_invalid`` go to ``report.skipped``."""
    with p.open("rb") as f:
        head = f.read(1024).lstrip()
    if head.startswith(b"["):
        try:
            array = json.loads(read_text(p))
        except json.JSONDecodeError as e:
            raise DataError(json_error(e), path=p, line=e.lineno) from None
        records: Iterable[tuple[int, Any]] = ((i + 1, r) for i, r in enumerate(array))
        where = "item"
    else:
        records = iter_jsonl(p, on_error="yield")
        where = "line"
    for n, record in records:
        try:
            if isinstance(record, DataError):
                raise record
            yield n, where, _passage_from_record(record, str(p), n)
        except DataError as e:
            if where == "item":
                e = DataError(e.message, path=p, field=e.field, record=f"JSON array item [{n - 1}]")
            if not skip_invalid:
                raise e from None
            report.skipped.append(e)


def write_corpus(path: str | Path, passages: Iterable[Passage]) -> int:
    return write_jsonl(path, (p.to_corpus_record() for p in passages))
