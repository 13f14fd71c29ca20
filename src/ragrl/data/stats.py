"""Summary statistics of a question set: what ``ragrl data stats`` prints.

``compute_stats(examples)`` returns a JSON-ready dict. Distributions are ``{value: count}`` with
string keys sorted by value. ``hops`` is ``metadata["hops"]`` as the loaders write it: the number of
distinct gold paragraphs (ARENA's Table 2 hop count), so the two can be compared directly.

``gold_reference_ids`` applies ARENA's gold-id rule (``ragrl.data.references``) to every question:
``per_question`` buckets the number of gold ids of the resolvable questions as ``1``, ``2``, ``3``,
``4+`` (every bucket present, zeros included), ``mean`` is their exact mean, and ``unresolvable``
counts the questions ARENA drops (any supporting fact resolved to nothing, no supporting facts, or no
passages; ``without_passages`` is the last group alone).
"""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Any

from rich.console import Console
from rich.table import Table

from ragrl.data.references import gold_reference_ids
from ragrl.data.schema import Example

MISSING = "(none)"


def _dist(values: list[Any]) -> dict[str, int]:
    counts = Counter(values)

    def key(v: Any) -> tuple[int, Any]:
        if v == MISSING:
            return (2, "")
        return (0, v) if isinstance(v, (int, float)) else (1, str(v))

    return {str(v): counts[v] for v in sorted(counts, key=key)}


def _summary(values: list[int]) -> dict[str, float]:
    if not values:
        return {"mean": 0.0, "median": 0.0, "max": 0}
    return {
        "mean": round(statistics.fmean(values), 3),
        "median": float(statistics.median(values)),
        "max": max(values),
    }


GOLD_ID_BUCKETS = ("1", "2", "3", "4+")


def _gold_reference_stats(examples: list[Example]) -> dict[str, Any]:
    counts = []
    unresolvable = 0
    for ex in examples:
        ref = gold_reference_ids(ex)
        if ref.unresolved:
            unresolvable += 1
        else:
            counts.append(len(ref.ids))
    buckets = Counter(str(c) if c < 4 else "4+" for c in counts)
    return {
        "questions": len(counts),
        "per_question": {b: buckets[b] for b in GOLD_ID_BUCKETS},
        "mean": round(statistics.fmean(counts), 3) if counts else None,
        "unresolvable": unresolvable,
        "without_passages": sum(1 for ex in examples if not ex.passages),
    }


def compute_stats(examples: list[Example]) -> dict[str, Any]:
    n = len(examples)
    hops = [ex.metadata["hops"] for ex in examples if isinstance(ex.metadata.get("hops"), int)]
    answer_tokens = [len(ex.answers[0].split()) for ex in examples if ex.answers]
    aliases = [max(len(ex.answers) - 1, 0) for ex in examples]
    with_passages = [ex for ex in examples if ex.passages is not None]
    unresolved = [len(ex.metadata.get("unresolved_supporting_facts") or ()) for ex in examples]
    answerable = Counter(
        {True: "answerable", False: "unanswerable"}.get(ex.metadata.get("answerable"), "unknown")
        for ex in examples
    )
    distinct_passages = {p.id for ex in with_passages for p in ex.passages or ()}
    return {
        "questions": n,
        "source": _dist([ex.metadata.get("source", MISSING) for ex in examples]),
        "type": _dist([ex.metadata.get("type", MISSING) for ex in examples]),
        "hops": _dist([ex.metadata.get("hops", MISSING) for ex in examples]),
        "mean_hops": round(statistics.fmean(hops), 3) if hops else None,
        "supporting_ids": _dist([len(ex.supporting_ids) for ex in examples]),
        "given_passages": {
            "questions_with_passages": len(with_passages),
            "per_question": _dist([len(ex.passages or ()) for ex in with_passages]),
            "total": sum(len(ex.passages or ()) for ex in with_passages),
            "distinct": len(distinct_passages),
        },
        "decomposition_steps": _dist([len(ex.decomposition) for ex in examples if ex.decomposition]),
        "answerable": {k: answerable[k] for k in ("answerable", "unanswerable", "unknown") if answerable[k]},
        "answer_tokens": _summary(answer_tokens),
        "aliases": {
            "total": sum(aliases),
            "questions_with_aliases": sum(1 for a in aliases if a),
            "max": max(aliases, default=0),
        },
        "unresolved_supporting_facts": {
            "questions": sum(1 for u in unresolved if u),
            "facts": sum(unresolved),
        },
        "gold_reference_ids": _gold_reference_stats(examples),
    }


def _dist_table(title: str, dist: dict[str, int], total: int) -> Table:
    table = Table(title=title, title_justify="left", min_width=len(title) + 4)
    table.add_column("value")
    table.add_column("count", justify="right")
    table.add_column("%", justify="right")
    for value, count in dist.items():
        table.add_row(value, str(count), f"{100 * count / total:.1f}" if total else "-")
    return table


def print_stats(stats: dict[str, Any], *, title: str = "", console: Console | None = None) -> None:
    """Rich tables (to stdout unless a console is given)."""
    console = console or Console()
    n = stats["questions"]
    gp = stats["given_passages"]
    if title:
        console.print(title, highlight=False, markup=False, soft_wrap=True)
    overview = Table(show_header=False)
    overview.add_column("what")
    overview.add_column("value", justify="right")
    at, al, un = stats["answer_tokens"], stats["aliases"], stats["unresolved_supporting_facts"]
    gr = stats["gold_reference_ids"]
    gr_mean = f"{gr['mean']:.3f}" if gr["mean"] is not None else "-"
    rows = [
        ("questions", n),
        ("mean hops", stats["mean_hops"] if stats["mean_hops"] is not None else "-"),
        ("questions with given passages", gp["questions_with_passages"]),
        ("given passages (total / distinct)", f"{gp['total']} / {gp['distinct']}"),
        ("answer tokens (mean / median / max)", f"{at['mean']:.2f} / {at['median']:g} / {at['max']}"),
        (
            "aliases (total / questions with any / max)",
            f"{al['total']} / {al['questions_with_aliases']} / {al['max']}",
        ),
        ("unresolved supporting facts (questions / facts)", f"{un['questions']} / {un['facts']}"),
        ("ARENA gold ids: resolvable questions / mean ids", f"{gr['questions']} / {gr_mean}"),
        (
            "ARENA gold ids: unresolvable questions (without passages)",
            f"{gr['unresolvable']} ({gr['without_passages']})",
        ),
    ]
    for what, value in rows:
        overview.add_row(what, str(value))
    console.print(overview)
    console.print(_dist_table("source", stats["source"], n))
    console.print(_dist_table("type", stats["type"], n))
    console.print(_dist_table("hops (distinct gold paragraphs)", stats["hops"], n))
    console.print(_dist_table("supporting ids per question", stats["supporting_ids"], n))
    if gr["questions"]:
        title = "ARENA gold reference ids per resolvable question"
        console.print(_dist_table(title, gr["per_question"], gr["questions"]))
    if gp["per_question"]:
        n_with = gp["questions_with_passages"]
        console.print(_dist_table("given passages per question", gp["per_question"], n_with))
    if stats["decomposition_steps"]:
        steps_total = sum(stats["decomposition_steps"].values())
        console.print(_dist_table("decomposition steps", stats["decomposition_steps"], steps_total))
    console.print(_dist_table("answerable", stats["answerable"], n))
