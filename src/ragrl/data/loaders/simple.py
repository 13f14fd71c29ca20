"""Question-answer files without contexts: FlashRAG jsonl (also our own canonical files) and the
two Bamboogle originals.

* Bamboogle CSV (the self-ask "Bamboogle Prerelease" sheet): UTF-8, no header row, 7 columns
  ``question, "", "", "", answer, answer2, ""``; ``answer2`` (one row has it) becomes an alias. A
  header row (first cell ``question``) is tolerated and skipped.
* Bamboogle JSON with decompositions (comp-gap-public): ``{Question, Answer, Q1, A1: [..], Q2, A2: [..]}``.

Bamboogle rows have no ids; row ``i`` (0-based) gets ``test_i``, the id FlashRAG's Bamboogle
``test.jsonl`` gives the same question (the three files list the 125 questions in the same order).
"""

from __future__ import annotations

from typing import Any

from ragrl.data.io import CANONICAL_FIELDS, LoadReport, not_kept
from ragrl.data.loaders.common import Context, Loc, NotARecord, dedupe, get_str, get_str_list, require_object
from ragrl.data.schema import Example, SubQuestion
from ragrl.errors import DataError

CSV_QUESTION, CSV_ANSWER, CSV_ANSWER2 = 0, 4, 5


def convert_flashrag(rec: Any, loc: Loc, ctx: Context) -> Example:
    try:
        example = Example.from_record(rec, path=loc.path, line=loc.line)
    except DataError as e:
        raise DataError(e.message, path=e.path, line=e.line, field=e.field, record=loc.record) from None
    for key in rec.keys() - CANONICAL_FIELDS:  # counted: finish_flashrag says what was not kept
        ctx.count(f"{NOT_KEPT}{key}")
    return example


NOT_KEPT = "not kept:"


def finish_flashrag(ctx: Context, report: LoadReport) -> None:
    """One warning for each field outside the canonical record that some records held."""
    for name, n in ctx.counters.items():
        if name.startswith(NOT_KEPT):
            report.warnings.append(not_kept(ctx.path, name.removeprefix(NOT_KEPT), n))


class BamboogleCsv:
    """Converter for CSV rows; numbers the data rows to build ids (blank rows and a header are not rows)."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, row: Any, loc: Loc, ctx: Context) -> Example:
        if not isinstance(row, list):
            raise loc.error("expected a CSV row")
        if not any(cell.strip() for cell in row):
            raise NotARecord
        if self.n == 0 and row[0].strip().lower() == "question":
            raise NotARecord
        if len(row) <= CSV_ANSWER:
            message = f"expected at least 5 columns (question, -, -, -, answer), got {len(row)}"
            raise loc.error(message, "answer")
        question = row[CSV_QUESTION].strip()
        if not question:
            raise loc.error("must be a non-empty string", "question")
        answer = row[CSV_ANSWER].strip()
        if not answer:
            raise loc.error("must be a non-empty string (column 5)", "answer")
        answers = [answer]
        if len(row) > CSV_ANSWER2 and row[CSV_ANSWER2].strip():
            answers.append(row[CSV_ANSWER2].strip())
        ex_id = f"test_{self.n}"
        self.n += 1
        return Example(id=ex_id, question=question, answers=dedupe(answers), metadata=_meta(ctx))


class BamboogleJson:
    """Converter for comp-gap-public's ``bamboogle.json`` (decomposed Bamboogle)."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, rec: Any, loc: Loc, ctx: Context) -> Example:
        rec = require_object(rec, loc)
        question = get_str(rec, "Question", loc, non_empty=True) or ""
        answer = get_str(rec, "Answer", loc) or ""
        steps = []
        i = 1
        while f"Q{i}" in rec:
            sub_q = get_str(rec, f"Q{i}", loc, non_empty=True) or ""
            steps.append(SubQuestion(sub_q, tuple(get_str_list(rec, f"A{i}", loc))))
            i += 1
        metadata = _meta(ctx)
        if steps:
            metadata["hops"] = len(steps)
        ex_id = f"test_{self.n}"
        self.n += 1
        return Example(
            id=ex_id, question=question, answers=[answer], decomposition=steps or None, metadata=metadata
        )


def _meta(ctx: Context) -> dict[str, Any]:
    return {"source": ctx.source} if ctx.source else {}


def is_flashrag(rec: dict[str, Any]) -> bool:
    return "golden_answers" in rec


def is_bamboogle_json(rec: dict[str, Any]) -> bool:
    return "Question" in rec and "Answer" in rec
