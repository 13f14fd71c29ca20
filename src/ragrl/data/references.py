"""ARENA's gold relevant reference ids: which of a question's given passages, numbered 1..n in their
original order, hold its supporting evidence (ARENA spec §1.4, §4.2).

``gold_reference_ids(example)`` computes them from the example alone:

* HotpotQA / 2Wiki (``metadata["supporting_sentences"]`` present, written by the loaders): for each
  supporting fact, the FIRST passage (1-based, in ``example.passages`` order) whose text contains the
  fact's sentence, stripped, as a substring. This is ARENA's rule, so a short sentence that also
  occurs in an earlier passage is assigned to that earlier passage. A fact whose sentence is ``None``
  (title absent, sentence index out of range), empty, or found in no passage gives ``-1``.
* Otherwise (MuSiQue, the synthetic world, any file with ``supporting_ids``): each supporting id is
  located among the passages by id, and maps to the first passage whose text contains that passage's
  text (ARENA's substring rule, which finds the passage itself or an earlier duplicate of it). An id
  that is not among the passages gives ``-1``.

``ids`` is ``sorted(set(ids))`` as in ARENA, so ``-1`` (at most once, first) marks unresolved facts;
``unresolved`` has one reason per fact that resolved to nothing. An example without passages gives
``ReferenceIds([], ["no passages"])``, one without supporting evidence ``ReferenceIds([], ["no
supporting facts"])``; both count as unresolved.

``attach_reference_ids(examples, rule)`` writes ``metadata["gold_reference_ids"]`` on copies of the
examples. ``rule`` says what happens to an example with any unresolved fact: ``"drop"`` (ARENA's
rule, the default) removes it, ``"keep"`` keeps it with ``-1`` in its ids, ``"error"`` raises
``DataError``. The ``ReferenceReport`` lists every dropped or kept-unresolved example id with its
reasons, so nothing is dropped silently.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ragrl.data.schema import Example, Passage
from ragrl.errors import DataError, RagrlError

UNRESOLVED_RULES = ("drop", "keep", "error")
GOLD_REFERENCE_KEY = "gold_reference_ids"
SENTENCES_KEY = "supporting_sentences"


@dataclass(frozen=True)
class ReferenceIds:
    """Gold reference ids of one example (see the module docstring)."""

    ids: list[int]  # sorted, distinct 1-based positions in example.passages; -1 = a fact resolved to nothing
    unresolved: list[str]  # one human-readable reason per supporting fact that resolved to nothing


def _first_containing(needle: str, passages: Sequence[Passage]) -> int:
    """1-based position of the first passage whose text contains ``needle``; -1 when none does."""
    return next((i for i, p in enumerate(passages, start=1) if needle in p.text), -1)


def _fact_name(facts: Any, k: int) -> str:
    if isinstance(facts, list) and k < len(facts):
        return f"supporting fact {facts[k]!r}"
    return f"supporting fact #{k}"


def _from_sentences(example: Example, passages: list[Passage]) -> ReferenceIds:
    sentences = example.metadata[SENTENCES_KEY]
    field_name = f"metadata.{SENTENCES_KEY}"
    if not isinstance(sentences, list) or not all(s is None or isinstance(s, str) for s in sentences):
        raise DataError(
            "must be a list of strings or nulls", record=f"question {example.id}", field=field_name
        )
    if not sentences:
        return ReferenceIds([], ["no supporting facts"])
    facts = example.metadata.get("supporting_facts")
    titles = {p.title for p in passages}
    ids: list[int] = []
    unresolved: list[str] = []
    for k, sentence in enumerate(sentences):
        name = _fact_name(facts, k)
        if sentence is None:
            fact = facts[k] if isinstance(facts, list) and k < len(facts) else None
            title = fact[0] if isinstance(fact, list) and fact and isinstance(fact[0], str) else None
            if title is not None and title.strip() not in titles:
                why = "title not among the given passages"
            elif title is not None:
                why = "sentence index out of range"
            else:
                why = "sentence not resolved by the loader"
            unresolved.append(f"{name}: {why}")
            ids.append(-1)
            continue
        needle = sentence.strip()
        if not needle:
            unresolved.append(f"{name}: empty sentence")
            ids.append(-1)
            continue
        position = _first_containing(needle, passages)
        if position == -1:
            unresolved.append(f"{name}: sentence {needle[:60]!r} is in no given passage")
        ids.append(position)
    return ReferenceIds(sorted(set(ids)), unresolved)


def _from_supporting_ids(example: Example, passages: list[Passage]) -> ReferenceIds:
    if not example.supporting_ids:
        return ReferenceIds([], ["no supporting facts"])
    by_id: dict[str, Passage] = {}
    for p in passages:
        by_id.setdefault(p.id, p)
    ids: list[int] = []
    unresolved: list[str] = []
    for sid in example.supporting_ids:
        passage = by_id.get(sid)
        if passage is None:
            unresolved.append(f"supporting id {sid!r} is not among the {len(passages)} given passages")
            ids.append(-1)
            continue
        needle = passage.text.strip()
        # An empty text would be "contained" in every passage: fall back to the passage itself.
        position = _first_containing(needle, passages) if needle else passages.index(passage) + 1
        ids.append(position)
    return ReferenceIds(sorted(set(ids)), unresolved)


def gold_reference_ids(example: Example) -> ReferenceIds:
    """ARENA's gold relevant ids of one example, computed from its evidence (never read back from
    ``metadata["gold_reference_ids"]``)."""
    passages = example.passages
    if not passages:
        return ReferenceIds([], ["no passages"])
    if example.metadata.get(SENTENCES_KEY) is not None:
        return _from_sentences(example, passages)
    return _from_supporting_ids(example, passages)


@dataclass
class ReferenceReport:
    """What ``attach_reference_ids`` did to a set of examples."""

    rule: str
    n_in: int = 0
    n_out: int = 0
    dropped: dict[str, list[str]] = field(default_factory=dict)  # example id -> reasons
    kept_unresolved: dict[str, list[str]] = field(default_factory=dict)  # example id -> reasons ("keep")
    distribution: dict[str, int] = field(default_factory=dict)  # len(ids) of the output examples -> count

    @property
    def mean(self) -> float | None:
        """Mean ``len(ids)`` over the output examples (None when there are none)."""
        total = sum(self.distribution.values())
        if not total:
            return None
        return round(sum(int(k) * v for k, v in self.distribution.items()) / total, 3)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "n_in": self.n_in,
            "n_out": self.n_out,
            "dropped": dict(self.dropped),
            "kept_unresolved": dict(self.kept_unresolved),
            "distribution": dict(self.distribution),
            "mean": self.mean,
        }

    def summary(self) -> str:
        """A few lines for a human: counts, the distribution and every dropped / kept-unresolved id."""
        dist = ", ".join(f"{k}: {v}" for k, v in self.distribution.items()) or "-"
        lines = [
            f"gold reference ids (rule {self.rule!r}): {self.n_in} examples in, {self.n_out} out; "
            f"ids per example {dist} (mean {self.mean if self.mean is not None else '-'})"
        ]
        for label, table in (("dropped", self.dropped), ("kept with -1", self.kept_unresolved)):
            if table:
                lines.append(f"{label}: {len(table)} examples with unresolved supporting facts:")
                lines.extend(f"  {ex_id}: {'; '.join(reasons)}" for ex_id, reasons in table.items())
        return "\n".join(lines)


def attach_reference_ids(
    examples: Sequence[Example], rule: str = "drop"
) -> tuple[list[Example], ReferenceReport]:
    """Copies of ``examples`` with ``metadata["gold_reference_ids"]`` set; an example with any
    unresolved fact is dropped, kept (with ``-1``) or raises ``DataError``, per ``rule``."""
    if rule not in UNRESOLVED_RULES:
        raise RagrlError(
            f"unknown unresolved-fact rule {rule!r}; choose one of: {', '.join(UNRESOLVED_RULES)}"
        )
    report = ReferenceReport(rule, n_in=len(examples))
    out: list[Example] = []
    lengths: Counter[int] = Counter()
    for ex in examples:
        ref = gold_reference_ids(ex)
        if ref.unresolved:
            if rule == "error":
                raise DataError(
                    "cannot build ARENA gold reference ids: "
                    + "; ".join(ref.unresolved)
                    + " (use the 'drop' or 'keep' rule to go on)",
                    record=f"question {ex.id}",
                    field=GOLD_REFERENCE_KEY,
                )
            if rule == "drop":
                report.dropped.setdefault(ex.id, []).extend(ref.unresolved)
                continue
            report.kept_unresolved.setdefault(ex.id, []).extend(ref.unresolved)
        metadata = dict(ex.metadata)
        metadata[GOLD_REFERENCE_KEY] = list(ref.ids)
        out.append(dataclasses.replace(ex, metadata=metadata))
        lengths[len(ref.ids)] += 1
    report.n_out = len(out)
    report.distribution = {str(k): lengths[k] for k in sorted(lengths)}
    return out, report
