"""Why an episode ended the way it did: one outcome per episode, read from its typed record.

A wrong answer after the agent found every supporting passage is a failure to read or to answer what
was asked; a wrong answer without them is a failure to search. Telling the two apart says which skill
training has to improve (docs/eval.md, "Outcomes").
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from ragrl.data.schema import Example
from ragrl.errors import RagrlError
from ragrl.rollout.backtrack import active_steps
from ragrl.rollout.trajectory import Trajectory

OUTCOMES = (
    "right",
    "no_answer",
    "wrong_with_all_evidence",
    "wrong_missing_evidence",
    "wrong_no_search",
    "wrong_unanswerable",
    "wrong_no_gold_evidence",
    "unscored",
)
"""In the order they are decided:

* ``unscored``: the question has no gold answer (no exact match to compute);
* ``right``: exact match;
* ``no_answer``: the episode ended without an answer (turns, tokens, an invalid last turn);
* ``wrong_unanswerable``: the question cannot be answered from the corpus (``Example.answerable``
  false) and the agent answered something other than its gold refusal;
* ``wrong_no_search``: it never searched (a method that reads the passages given with the question
  lands here when it is wrong; so does a search agent that answered from its weights);
* ``wrong_no_gold_evidence``: the question names no supporting passages, so what was found cannot be
  judged;
* ``wrong_with_all_evidence``: every supporting passage was retrieved by a search still in the agent's
  context when it ended (a backtrack takes its searches out; an observation cut short by the token
  budget still counts as retrieved) — a **reading** miss;
* ``wrong_missing_evidence``: some supporting passage was not — a **search** miss."""


def outcome(trajectory: Trajectory, example: Example, exact_match: float | None) -> str:
    """The outcome of one episode (``OUTCOMES``), given its exact-match score (None: no gold answer)."""
    if exact_match is None:
        return "unscored"
    if exact_match >= 1.0:
        return "right"
    if trajectory.final_answer is None:
        return "no_answer"
    if not example.answerable:
        return "wrong_unanswerable"
    if trajectory.num_searches == 0:
        return "wrong_no_search"
    if not example.supporting_ids:
        return "wrong_no_gold_evidence"
    actions = trajectory.actions
    kept = [actions[i] for i in active_steps(actions, len(actions)) if actions[i].kind == "search"]
    seen = {pid for action in kept for pid in action.retrieved_ids}
    return "wrong_with_all_evidence" if set(example.supporting_ids) <= seen else "wrong_missing_evidence"


def count_outcomes(outcomes: Sequence[str]) -> dict[str, int]:
    """How many episodes had each outcome (every outcome listed, in ``OUTCOMES`` order)."""
    counts = Counter(outcomes)
    unknown = sorted(set(counts) - set(OUTCOMES))
    if unknown:
        raise RagrlError(f"unknown outcome(s) {unknown}; the outcomes are {', '.join(OUTCOMES)}")
    return {name: counts[name] for name in OUTCOMES}
