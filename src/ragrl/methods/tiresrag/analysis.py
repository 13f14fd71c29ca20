"""TIRESRAG-R1's failure-pattern analysis (spec §4, the paper's §3 and App. B): over-, good and
under-thinking, by correctness (the paper's Table 1), from saved trajectories.

An episode is ``Q, R_1, D_1, …, R_n, D_n, R_{n+1}``: R_i the reasoning before the i-th search, D_i the
documents it found. The sufficiency judge (R^S's, with the gold answer) reads the episode cut after
each search, and the whole episode:

* prefix k (k = 0 … n) is the episode up to the end of D_k (prefix 0 is R_1 alone, before any search);
* the full episode adds R_{n+1}; every ``<answer>`` span is removed, as for R^S.

The first sufficient cut ``k*`` decides the category:

* **underthinking**: no cut is sufficient (the policy answered without the evidence);
* **overthinking**: ``k* < n`` (the answer could be inferred before the last search, which was not
  needed);
* **good thinking**: ``k* = n`` (sufficient exactly after the last search) or only the full episode
  (the last reasoning completes it).

The paper does not say how the per-step verdicts were obtained (§8 Q15); judging prefixes is the
spec's reading. Its definition of overthinking ("inferable at R_i with i < n") skips the case where
only the last search was unnecessary (inferable at R_n, from D_1 … D_{n−1}); ``k* < n`` counts it.
Correct is cover-EM of the final answer with the method's normalization (the paper does not name its
measure; the step diagnostics' 2×2 uses the same). Every verdict is one batch to the judge: the same
``judge`` settings as R^S, the offline proxy by default.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ragrl.data.schema import Example
from ragrl.errors import RagrlError
from ragrl.methods.tiresrag.judges import (
    SUFFICIENCY_SYSTEM,
    SUFFICIENCY_TEMPLATE,
    judge_parse_failures,
    sufficiency_reward,
)
from ragrl.methods.tiresrag.protocol import turn_segments
from ragrl.methods.tiresrag.rewards import answer_right
from ragrl.rewards.registry import RewardContext
from ragrl.rollout.trajectory import Trajectory

CATEGORIES = ("overthinking", "good thinking", "underthinking")


@dataclass
class ThinkingVerdict:
    """One episode's place in Table 1."""

    id: str
    category: str
    correct: bool
    searches: int
    """The searches that ran (each returned documents, so each has a cut)."""
    first_sufficient: int | None
    """``k*``: the first sufficient cut (0 … n), ``n + 1`` for the full episode only, None if none."""
    sufficient: list[float]
    """The judge's verdict on each cut 0 … n, then on the full episode."""
    unreadable: int = 0
    """How many of those replies the judge's parser could not read (each scored 0)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "category": self.category,
            "correct": self.correct,
            "searches": self.searches,
            "first_sufficient": self.first_sufficient,
            "sufficient": self.sufficient,
            "unreadable": self.unreadable,
        }


def search_prefixes(trajectory: Trajectory) -> list[Trajectory]:
    """The episode cut after each search's observation: cut k (1 … n) ends with the documents of the
    k-th search that ran; cut 0 is the policy's first turn alone. Actions and segments are kept up to
    the cut (a search that never ran, for want of a turn or tokens, has no cut)."""
    segments, actions = trajectory.segments, trajectory.actions
    turns = {id(s) for s in turn_segments(trajectory)}
    search_turns = {a.turn for a in actions if a.kind == "search"}

    def cut(n_segments: int, last_turn: int) -> Trajectory:
        kept = [a for a in actions if a.turn <= last_turn]
        return Trajectory(trajectory.example_id, trajectory.prompt_ids, segments[:n_segments], kept)

    cuts: list[Trajectory] = []
    turn = -1
    for i, segment in enumerate(segments):
        if segment.kind == "policy":
            if id(segment) in turns:
                turn += 1
                if turn == 0:
                    cuts.append(cut(i + 1, 0))
            continue
        ends_observation = i + 1 == len(segments) or id(segments[i + 1]) in turns  # a turn follows
        if turn in search_turns and ends_observation:
            cuts.append(cut(i + 1, turn))
    return cuts or [cut(0, -1)]


def categorize(sufficient: Sequence[float], searches: int) -> tuple[str, int | None]:
    """The category and ``k*`` from the verdicts on cuts 0 … n and the full episode (last)."""
    first = next((k for k, v in enumerate(sufficient) if v >= 0.5), None)
    if first is None:
        return "underthinking", None
    return ("overthinking" if first < searches else "good thinking"), first


def analyze_thinking(
    trajectories: Sequence[Trajectory],
    examples: Sequence[Example],
    *,
    judge: dict[str, Any] | None = None,
    system: str = SUFFICIENCY_SYSTEM,
    template: str = SUFFICIENCY_TEMPLATE,
    prefill: str = "",
) -> list[ThinkingVerdict]:
    """Every episode's verdict: one batch of sufficiency judgements over all cuts of all episodes (each
    cut read with the protocol's ``prefill`` first, as the reward reads it)."""
    if len(trajectories) != len(examples):
        raise RagrlError(f"{len(trajectories)} episodes but {len(examples)} questions")
    batch: list[Trajectory] = []
    owners: list[Example] = []
    spans: list[tuple[int, int]] = []
    fulls = [
        dataclasses.replace(t, metadata={k: v for k, v in t.metadata.items() if k != "judge"})
        for t in trajectories
    ]
    for t, e in zip(fulls, examples, strict=True):  # copies without earlier judges' replies
        cuts = [*search_prefixes(t), t]
        spans.append((len(batch), len(batch) + len(cuts)))
        batch.extend(cuts)
        owners.extend([e] * len(cuts))
    ctx = RewardContext()
    verdicts = sufficiency_reward(
        batch, owners, ctx, judge=judge, system=system, template=template, prefill=prefill
    )
    out = []
    unreadable = [judge_parse_failures([t]).get("tiresrag_sufficiency", 0) for t in batch]
    for t, e, (lo, hi) in zip(fulls, examples, spans, strict=True):
        sufficient = verdicts[lo:hi]
        searches = hi - lo - 2  # the cuts after a search that ran (the cut before any, and the whole, aside)
        category, first = categorize(sufficient, searches)
        correct = answer_right(t.final_answer, e.answers)
        out.append(
            ThinkingVerdict(
                t.example_id, category, correct, searches, first, sufficient, sum(unreadable[lo:hi])
            )
        )
    return out


def table1(verdicts: Sequence[ThinkingVerdict]) -> dict[str, dict[str, int]]:
    """``{category: {"correct": n, "incorrect": n}}`` in the paper's row order."""
    counts = Counter((v.category, v.correct) for v in verdicts)
    return {c: {"correct": counts[(c, True)], "incorrect": counts[(c, False)]} for c in CATEGORIES}


def table1_markdown(verdicts: Sequence[ThinkingVerdict]) -> str:
    """Table 1 as markdown, with each cell's share of its column."""
    table = table1(verdicts)
    totals = {col: sum(row[col] for row in table.values()) for col in ("correct", "incorrect")}

    def cell(n: int, col: str) -> str:
        return f"{n} ({100 * n / totals[col]:.0f}%)" if totals[col] else "0"

    lines = ["| category | correct | incorrect |", "|---|---|---|"]
    for category, row in table.items():
        right, wrong = cell(row["correct"], "correct"), cell(row["incorrect"], "incorrect")
        lines.append(f"| {category} | {right} | {wrong} |")
    lines.append(f"| total | {totals['correct']} | {totals['incorrect']} |")
    return "\n".join(lines)
