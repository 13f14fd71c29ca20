"""Retrieval quality of a retriever on a question file: recall@k of the supporting passages, full
recall, answer-string recall, MRR and MAP (definitions in ``ragrl.metrics.retrieval``)."""

from __future__ import annotations

from collections.abc import Sequence

from ragrl.data.schema import Example
from ragrl.metrics.retrieval import aggregate_retrieval, retrieval_scores
from ragrl.retrieval.base import Hit, Retriever


def evaluate_hits(
    examples: Sequence[Example], hits: Sequence[list[Hit]], ks: Sequence[int] = (2, 5, 10)
) -> dict[str, float]:
    """Aggregate retrieval metrics of ``hits[i]`` against ``examples[i]``'s supporting ids and answers."""
    rows = [
        retrieval_scores(
            [h.passage.id for h in ex_hits],
            [h.passage.contents for h in ex_hits],
            list(ex.supporting_ids),
            list(ex.answers),
            ks=tuple(ks),
        )
        for ex, ex_hits in zip(examples, hits, strict=True)
    ]
    return aggregate_retrieval(rows)


def evaluate_retriever(
    retriever: Retriever, examples: Sequence[Example], ks: Sequence[int] = (2, 5, 10), batch_size: int = 256
) -> dict[str, float]:
    """Search every question (at depth ``max(ks)``) and aggregate the retrieval metrics."""
    depth = max(ks)
    hits: list[list[Hit]] = []
    for start in range(0, len(examples), batch_size):
        batch = examples[start : start + batch_size]
        hits.extend(retriever.search([ex.question for ex in batch], k=depth))
    return evaluate_hits(examples, hits, ks)
