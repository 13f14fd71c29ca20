"""MuSiQue: ``paragraphs: [{idx, title, paragraph_text, is_supporting}]`` and
``question_decomposition: [{id, question, answer, paragraph_support_idx}]``.

Supporting ids come from ``is_supporting`` (paragraph order); each decomposition step gets the id of
the paragraph its ``paragraph_support_idx`` names. The variant without ``paragraphs`` (a JSON array
whose steps carry a ``document_id`` instead) has no passages: its supporting paragraph indices and
document ids are kept in metadata and the report says once that they cannot be mapped to passage ids.
"""

from __future__ import annotations

import re
from typing import Any

from ragrl.data.io import LoadReport
from ragrl.data.loaders.common import Context, Loc, dedupe, get_id, get_str, get_str_list, require_object
from ragrl.data.schema import Example, Passage, SubQuestion

_HOP_TYPE = re.compile(r"^(\d+hop\d*)__")


def _parse_paragraphs(raw: Any, loc: Loc) -> list[tuple[int, Passage, bool]]:
    if not isinstance(raw, list):
        raise loc.error("must be a list of paragraph objects", "paragraphs")
    out = []
    for i, p in enumerate(raw):
        name = f"paragraphs[{i}]"
        if not isinstance(p, dict):
            raise loc.error("must be an object", name)
        title, text = p.get("title"), p.get("paragraph_text")
        if not isinstance(title, str):
            raise loc.error("missing or not a string", f"{name}.title")
        if not isinstance(text, str):
            raise loc.error("missing or not a string", f"{name}.paragraph_text")
        idx = p.get("idx", i)
        if not isinstance(idx, int) or isinstance(idx, bool):
            raise loc.error("must be an integer", f"{name}.idx")
        supporting = p.get("is_supporting", False)
        if not isinstance(supporting, bool):
            raise loc.error("must be true or false", f"{name}.is_supporting")
        out.append((idx, Passage.make(title, text), supporting))
    return out


def convert_musique(rec: Any, loc: Loc, ctx: Context) -> Example:
    rec = require_object(rec, loc)
    ex_id = get_id(rec, ("id", "_id"), loc)
    question = get_str(rec, "question", loc, non_empty=True) or ""
    answer = get_str(rec, "answer", loc) or ""
    aliases = get_str_list(rec, "answer_aliases", loc)
    answerable = rec.get("answerable")
    if answerable is not None and not isinstance(answerable, bool):
        raise loc.error("must be true or false", "answerable")

    metadata: dict[str, Any] = {}
    if ctx.source:
        metadata["source"] = ctx.source
    m = _HOP_TYPE.match(ex_id)
    if m:
        metadata["type"] = m.group(1)

    paragraphs = _parse_paragraphs(rec["paragraphs"], loc) if rec.get("paragraphs") is not None else None
    by_idx = {idx: p for idx, p, _ in paragraphs} if paragraphs is not None else {}
    passages = [p for _, p, _ in paragraphs] if paragraphs is not None else None
    supporting_ids = dedupe([p.id for _, p, s in paragraphs if s]) if paragraphs is not None else []
    support_idxs = sorted({idx for idx, _, s in paragraphs if s}) if paragraphs is not None else []

    decomposition = None
    raw_steps = rec.get("question_decomposition")
    if raw_steps is not None:
        if not isinstance(raw_steps, list):
            raise loc.error("must be a list of steps", "question_decomposition")
        decomposition, step_idxs, doc_ids = [], [], []
        for i, step in enumerate(raw_steps):
            name = f"question_decomposition[{i}]"
            if not isinstance(step, dict):
                raise loc.error("must be an object", name)
            sub_q = step.get("question")
            if not isinstance(sub_q, str):
                raise loc.error("missing or not a string", f"{name}.question")
            sub_a = step.get("answer", "")
            if not isinstance(sub_a, str):
                raise loc.error("must be a string", f"{name}.answer")
            psi = step.get("paragraph_support_idx")
            if psi is not None and (not isinstance(psi, int) or isinstance(psi, bool)):
                raise loc.error("must be an integer or null", f"{name}.paragraph_support_idx")
            step_ids: tuple[str, ...] = ()
            if psi is not None:
                step_idxs.append(psi)
                if paragraphs is not None:
                    if psi in by_idx:
                        step_ids = (by_idx[psi].id,)
                    else:
                        ctx.warnings.append(
                            f"{loc}: question {ex_id}: step {i + 1} names paragraph {psi}, which is not "
                            "among its paragraphs"
                        )
            if isinstance(step.get("document_id"), str):
                doc_ids.append(step["document_id"])
            decomposition.append(SubQuestion(sub_q, (sub_a,), step_ids))
        # ARENA's Table 2: hops = distinct paragraphs named by paragraph_support_idx.
        metadata["hops"] = len(set(step_idxs)) if step_idxs else len(decomposition)
        if paragraphs is None:
            support_idxs = sorted(set(step_idxs))
            if doc_ids:
                metadata["supporting_document_ids"] = doc_ids
            if step_idxs:
                ctx.count("support_without_paragraphs")
    elif paragraphs is not None:
        metadata["hops"] = len(support_idxs)
    if support_idxs:
        metadata["supporting_paragraph_idxs"] = support_idxs
    if answerable is not None:
        metadata["answerable"] = answerable

    answers = dedupe([answer, *aliases])
    return Example(
        id=ex_id,
        question=question,
        answers=answers,
        supporting_ids=supporting_ids,
        passages=passages,
        decomposition=decomposition,
        metadata=metadata,
    )


def finish_musique(ctx: Context, report: LoadReport) -> None:
    n = ctx.counters.get("support_without_paragraphs", 0)
    if n:
        report.warnings.append(
            f"{ctx.path}: {n} records have no 'paragraphs', so their supporting paragraphs cannot be mapped "
            "to passage ids (indices kept in metadata['supporting_paragraph_idxs'])"
        )


def is_musique(rec: dict[str, Any]) -> bool:
    return "paragraphs" in rec or "question_decomposition" in rec or "answer_aliases" in rec
