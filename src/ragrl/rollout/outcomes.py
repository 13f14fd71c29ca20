"""Why an episode ended the way it did: one outcome per episode, read from its typed record.

A wrong answer after the agent found every supporting passage is a failure to read or to answer what
was asked; a wrong answer without them is a failure to search. Telling the two apart says which skill
training has to improve (docs/eval.md, "Outcomes").
"""

from __future__ import annotations

from collections.abc import Sequence

from ragrl.data.schema import Example
from ragrl.rollout.trajectory import Trajectory

OUTCOMES = (
    "right",
    "no_answer",
    "wrong_with_all_evidence",
    "wrong_missing_evidence",
    "wrong_no_search",
    "wrong",
)
"""``right``: exact match. ``no_answer``: the episode ended without an answer. The wrong answers of an
episode that searched, when the question names its supporting passages: every one of them was retrieved
(``wrong_with_all_evidence``) or some were not (``wrong_missing_evidence``). ``wrong_no_search``: it
never searched (a method that reads given passages always lands here or in ``right``). ``wrong``: the
question names no supporting passages."""


def outcome(trajectory: Trajectory, example: Example, exact_match: float) -> str:
    """The outcome of one episode (``OUTCOMES``), given its exact-match score."""
    if exact_match >= 1.0:
        return "right"
    if trajectory.final_answer is None:
        return "no_answer"
    if trajectory.num_searches == 0:
        return "wrong_no_search"
    if not example.supporting_ids:
        return "wrong"
    if set(example.supporting_ids) <= set(trajectory.retrieved_ids):
        return "wrong_with_all_evidence"
    return "wrong_missing_evidence"


def count_outcomes(outcomes: Sequence[str]) -> dict[str, int]:
    """How many episodes had each outcome (every outcome listed, in ``OUTCOMES`` order)."""
    return {name: sum(o == name for o in outcomes) for name in OUTCOMES}
