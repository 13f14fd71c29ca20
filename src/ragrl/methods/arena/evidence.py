"""ARENA's gold evidence and the rule for questions whose evidence no given passage holds
(``prepare_examples``).

Gold reference ids are ``example.metadata["gold_reference_ids"]`` when a loader stored them, else
``ragrl.data.references.gold_reference_ids(example)`` (for each supporting fact, the first given passage
that contains it; a fact found in no passage counts as the id ``-1``, as in the authors' code, so full
relevance credit is then impossible).
"""

from __future__ import annotations

from collections.abc import Sequence

from ragrl.console import console
from ragrl.data.references import GOLD_REFERENCE_KEY
from ragrl.data.schema import Example
from ragrl.errors import RagrlError


def gold_ids(example: Example) -> list[int]:
    """The example's gold reference numbers (1-based positions in ``example.passages``), sorted and
    de-duplicated; ``-1`` stands for a supporting fact found in no passage (arena.md §4.2)."""
    stored = example.metadata.get(GOLD_REFERENCE_KEY)
    if stored is not None:
        if not isinstance(stored, list | tuple) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in stored
        ):
            raise RagrlError(
                f"example {example.id!r}: metadata.{GOLD_REFERENCE_KEY} must be a list of integers, "
                f"got {stored!r}"
            )
        return sorted(set(stored))
    from ragrl.data.references import gold_reference_ids

    return sorted(set(gold_reference_ids(example).ids))


def prepare_examples(examples: Sequence[Example], where: str, rule: str = "drop") -> list[Example]:
    """Attach the gold reference ids (``metadata["gold_reference_ids"]``) and apply ``rule`` to questions
    whose evidence cannot be located; what is dropped is printed, never silent."""
    from ragrl.data.references import attach_reference_ids

    kept, report = attach_reference_ids(examples, rule)
    if report.dropped or report.kept_unresolved:
        head = report.summary().splitlines()[0]
        ids = list(report.dropped or report.kept_unresolved)
        more = f" (+{len(ids) - 5} more)" if len(ids) > 5 else ""
        console.print(f"{where}: {head}; unresolved: {', '.join(ids[:5])}{more}")
    return kept
