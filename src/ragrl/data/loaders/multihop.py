"""HotpotQA and 2WikiMultiHopQA: records with ``context`` paragraphs as sentence lists and
``supporting_facts`` as ``(title, sentence index)`` pairs.

Both the original list layout (``context: [[title, [sent, ...]], ...]``,
``supporting_facts: [[title, sent_id], ...]``) and the Hugging Face dict layout
(``context: {title: [...], sentences: [[...]]}``, ``supporting_facts: {title: [...], sent_id: [...]}``)
are read; ``metadata["supporting_facts"]`` is always written in the list layout, which is what the
official HotpotQA / 2Wiki evaluation scripts expect.

A supporting fact maps to the first passage with that title whose sentence index is in range. A
fact that maps to nothing is kept in ``metadata["unresolved_supporting_facts"]`` and reported as a
warning, never dropped silently.

``metadata["supporting_sentences"]`` holds, per supporting fact and in fact order, the text of its
sentence exactly as the dataset gives it (HotpotQA's with their leading space), or ``None`` for a fact
that maps to nothing; ``ragrl.data.references`` applies ARENA's gold-id rule to it.
"""

from __future__ import annotations

from typing import Any

from ragrl.data.io import LoadReport
from ragrl.data.loaders.common import (
    Context,
    Loc,
    dedupe,
    get_id,
    get_str,
    join_sentences,
    require_object,
)
from ragrl.data.schema import Example, Passage

# 2Wiki fields carried into metadata unchanged (``evidences`` is needed for 2Wiki evidence scoring).
TWOWIKI_EXTRA_KEYS = ("evidences", "entity_ids", "answer_id", "evidences_id")
TWOWIKI_TYPES = {"compositional", "inference", "bridge_comparison"}


def _zip_columns(raw: dict[str, Any], keys: tuple[str, str], loc: Loc, field: str) -> list[list[Any]]:
    """The Hugging Face dict layout (``{key_a: [...], key_b: [...]}``) as a list of pairs."""
    a, b = raw.get(keys[0]), raw.get(keys[1])
    if not isinstance(a, list) or not isinstance(b, list) or len(a) != len(b):
        raise loc.error(f"the dict layout needs lists '{keys[0]}' and '{keys[1]}' of the same length", field)
    return [[x, y] for x, y in zip(a, b, strict=True)]


def parse_context(raw: Any, loc: Loc) -> list[tuple[str, list[str]]]:
    if isinstance(raw, dict):
        pairs: list[Any] = _zip_columns(raw, ("title", "sentences"), loc, "context")
    elif isinstance(raw, list):
        pairs = raw
    else:
        raise loc.error(
            "must be a list of [title, sentences] pairs or a {title, sentences} object", "context"
        )
    out = []
    for i, pair in enumerate(pairs):
        if (
            not isinstance(pair, (list, tuple))
            or len(pair) != 2
            or not isinstance(pair[0], str)
            or not isinstance(pair[1], list)
            or not all(isinstance(s, str) for s in pair[1])
        ):
            raise loc.error("must be a [title, [sentence, ...]] pair", f"context[{i}]")
        out.append((pair[0], list(pair[1])))
    return out


def parse_supporting_facts(raw: Any, loc: Loc) -> list[tuple[str, int]]:
    if isinstance(raw, dict):
        pairs: list[Any] = _zip_columns(raw, ("title", "sent_id"), loc, "supporting_facts")
    elif isinstance(raw, list):
        pairs = raw
    else:
        raise loc.error("must be a list of [title, sentence index] pairs", "supporting_facts")
    out = []
    for i, pair in enumerate(pairs):
        if (
            not isinstance(pair, (list, tuple))
            or len(pair) != 2
            or not isinstance(pair[0], str)
            or not isinstance(pair[1], int)
            or isinstance(pair[1], bool)
        ):
            raise loc.error("must be a [title, sentence index] pair", f"supporting_facts[{i}]")
        out.append((pair[0], pair[1]))
    return out


def _fact_paragraphs(
    facts: list[tuple[str, int]], context: list[tuple[str, list[str]]]
) -> list[tuple[int | None, list[int]]]:
    """Per fact: the index of the first paragraph with its title whose sentence index is in range
    (None when there is none), and the indices of all paragraphs with that title."""
    by_title: dict[str, list[int]] = {}
    for i, (title, _) in enumerate(context):
        by_title.setdefault(title.strip(), []).append(i)
    out: list[tuple[int | None, list[int]]] = []
    for title, sent_id in facts:
        candidates = by_title.get(title.strip(), [])
        hit = next((i for i in candidates if 0 <= sent_id < len(context[i][1])), None)
        out.append((hit, candidates))
    return out


def supporting_sentences(
    facts: list[tuple[str, int]], context: list[tuple[str, list[str]]]
) -> list[str | None]:
    """The sentence text of each fact, in fact order (as given, not stripped); None when the fact
    maps to no paragraph (same rule as ``resolve_supporting_facts``)."""
    return [
        context[hit][1][sent_id] if hit is not None else None
        for (_, sent_id), (hit, _) in zip(facts, _fact_paragraphs(facts, context), strict=True)
    ]


def resolve_supporting_facts(
    facts: list[tuple[str, int]], context: list[tuple[str, list[str]]], passages: list[Passage]
) -> tuple[list[str], list[tuple[str, int, str]]]:
    """Passage ids for the facts (distinct, in fact order) and the facts that resolve to nothing,
    each with the reason."""
    ids: list[str] = []
    unresolved: list[tuple[str, int, str]] = []
    for (title, sent_id), (hit, candidates) in zip(facts, _fact_paragraphs(facts, context), strict=True):
        if hit is not None:
            ids.append(passages[hit].id)
        elif not candidates:
            unresolved.append((title, sent_id, "title not in context"))
        else:
            sizes = "/".join(str(len(context[i][1])) for i in candidates)
            why = f"sentence index out of range (paragraph has {sizes} sentences)"
            unresolved.append((title, sent_id, why))
    return dedupe(ids), unresolved


def convert_multihop(rec: Any, loc: Loc, ctx: Context) -> Example:
    """One HotpotQA or 2Wiki record (list or dict layout) to an ``Example``."""
    rec = require_object(rec, loc)
    ex_id = get_id(rec, ("_id", "id"), loc)
    question = get_str(rec, "question", loc, non_empty=True)
    answer = get_str(rec, "answer", loc)
    facts = None
    if rec.get("supporting_facts") is not None:
        facts = parse_supporting_facts(rec["supporting_facts"], loc)
    context = parse_context(rec["context"], loc) if rec.get("context") is not None else None

    metadata: dict[str, Any] = {}
    if ctx.source:
        metadata["source"] = ctx.source
    for key in ("type", "level"):
        value = get_str(rec, key, loc, required=False)
        if value is not None:
            metadata[key] = value

    passages = None
    supporting_ids: list[str] = []
    if context is not None:
        passages = [Passage.make(title, join_sentences(sents)) for title, sents in context]
    if facts is not None:
        # ARENA's Table 2 counts hops as the number of distinct gold paragraphs (len(gold_ids)).
        metadata["hops"] = len({title.strip() for title, _ in facts})
        metadata["supporting_facts"] = [[t, s] for t, s in facts]
        if context is not None and passages is not None:
            supporting_ids, unresolved = resolve_supporting_facts(facts, context, passages)
            metadata["supporting_sentences"] = supporting_sentences(facts, context)
            if unresolved:
                metadata["unresolved_supporting_facts"] = [[t, s] for t, s, _ in unresolved]
                for title, sent_id, why in unresolved:
                    ctx.warnings.append(
                        f"{loc}: question {ex_id}: supporting fact [{title!r}, {sent_id}] not resolved: {why}"
                    )
        elif facts:
            ctx.count("facts_without_context")
    for key in TWOWIKI_EXTRA_KEYS:
        if key in rec:
            metadata[key] = rec[key]

    return Example(
        id=ex_id,
        question=question or "",
        answers=[answer or ""],
        supporting_ids=supporting_ids,
        passages=passages,
        metadata=metadata,
    )


def finish_multihop(ctx: Context, report: LoadReport) -> None:
    n = ctx.counters.get("facts_without_context", 0)
    if n:
        report.warnings.append(
            f"{ctx.path}: {n} records have supporting facts but no 'context', so the facts cannot be "
            "mapped to passage ids (they are kept in metadata['supporting_facts'])"
        )


def is_twowiki(rec: dict[str, Any]) -> bool:
    if "level" in rec:
        return False
    kind = rec.get("type")
    return any(k in rec for k in TWOWIKI_EXTRA_KEYS) or (isinstance(kind, str) and kind in TWOWIKI_TYPES)
