"""What a backtrack takes back: one rule for the engine, the rewards and text replays.

A protocol that ``backtracks`` (EVO-RAG's BACKTRACK) lets the policy drop steps from the context it
sees; the step count goes on. The steps in the context before a backtrack are its *hops*, numbered
from 1 in order. A backtrack whose ``content`` is empty (``<backtrack/>``) takes back the last hop; one
with a hop number k (``<backtrack>k</backtrack>``) rolls the context back to just before hop k, taking
back hops k to the last. The backtrack turn itself never stays in the context. A backtrack with
nothing to take back (no hop yet) or a hop number outside 1..hops is an invalid action (spec
``methods/evo-rag.md`` §1.3), which the engine answers with the protocol's corrective like any other.
"""

from __future__ import annotations

from collections.abc import Sequence

from ragrl.rollout.trajectory import Action


def hops_kept(action: Action, hops: int) -> tuple[int, str | None]:
    """How many of the ``hops`` steps in the context a backtrack keeps, and, where it is invalid, why
    (then nothing is taken back)."""
    if hops < 1:
        return hops, "nothing to take back"
    if not action.content:
        return hops - 1, None
    k = int(action.content) if action.content.isascii() and action.content.isdigit() else 0
    if not 1 <= k <= hops:
        return hops, f"no step {action.content} to go back to (the context holds steps 1 to {hops})"
    return k - 1, None


def invalid_backtrack(action: Action, hops: int) -> Action | None:
    """The invalid action a backtrack turns into when it cannot be carried out, or None when it can."""
    _, why = hops_kept(action, hops)
    return None if why is None else Action("invalid", turn=action.turn, error=f"backtrack: {why}")


def active_steps(actions: Sequence[Action], t: int) -> list[int]:
    """The steps still in the agent's context just before step ``t``: each backtrack takes back the hops
    ``hops_kept`` says (and is not a hop itself); every other step is one."""
    stack: list[int] = []
    for i, action in enumerate(actions[:t]):
        if action.kind == "backtrack":
            keep, why = hops_kept(action, len(stack))
            if why is None:
                del stack[keep:]
        else:
            stack.append(i)
    return stack
