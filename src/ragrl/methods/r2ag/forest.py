"""R²AG's progressive iterative training: the RR-Forest rounds of Algorithm 1 (§3.3).

Round 0 is one tree per training question, root only (empty context). Every training step takes the next
``prompts_per_step`` trees of the round; each is expanded ``G`` times (one group per (tree, step)). Every
rollout that did not finish (not all gold retrieved, or no stop) leaves a tree for the next round:

* pruned bottom-up to its gold-hitting branches (``RRT.prune``; edge weight = new gold documents);
* with the gold documents recovered so far as its context, d̃^{j+1} = r̃^{j+1} ∩ g: case (i) partial gold
  (learn the next hop), (ii) none (the question again, to an improved policy), (iii) all gold but no
  stop (learn to stop);
* de-duplicated by (question, set of context documents) [interp, §8.2 item 8], the first kept.

A round ends when its trees run out; the next starts with the trees it left. Training ends when a round
leaves none, or after ``max_rounds`` rounds (L_MAX-I; the paper's ``while j ≤ L_MAX-I`` from 0 would
be one more, §8.2 item 7: a tree then never has more steps than an evaluated one). The last batch of a
round that does not fill a step is completed with the round's first trees again (in a round smaller
than a step, trees repeat), so every step trains ``prompts_per_step`` groups.

Trees are visited in a seeded shuffle per round. The forest's whole state (the round, its position, its
trees and the next round's) is a JSON-ready dict saved with every checkpoint: a resumed run takes
exactly the trees the uninterrupted one would have.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from ragrl.data.schema import Example
from ragrl.errors import RagrlError
from ragrl.methods.r2ag.protocol import CONTEXT_KEY, context_passages, step_records
from ragrl.methods.r2ag.tree import RRT, TREE_KEY
from ragrl.rollout.trajectory import Trajectory

ROOT_KEY = "r2ag_root"
ROUND_KEY = "r2ag_round"


def root_id(example: Example) -> str:
    return str(example.metadata.get(ROOT_KEY, example.id))


def state_key(example: Example) -> tuple[str, frozenset[str]]:
    return root_id(example), frozenset(p["id"] for p in context_passages(example))


def next_state(trajectory: Trajectory, state: Example, round_index: int) -> Example | None:
    """The tree this rollout of ``state`` leaves for round ``round_index`` (None when it finished: every
    gold document retrieved and the stop written)."""
    (step,) = step_records(trajectory)
    gold = set(state.supporting_ids)
    context = context_passages(state)
    have = {p["id"] for p in context}
    if gold <= have | set(step.retrieved) and step.stop:
        return None
    tree = RRT.from_records(state.question, trajectory.metadata.get(TREE_KEY) or [])
    new_docs: dict[str, dict[str, str]] = {}
    old = len(state.metadata.get(TREE_KEY) or [])
    for vertex in tree.vertices[old:]:  # this step's retrievals, in order: weight = gold found first
        for d in vertex.docs:
            if d["id"] in gold and d["id"] not in have and d["id"] not in new_docs:
                new_docs[d["id"]] = d
                vertex.new_gold += 1
    pruned = tree.prune()
    context = [*context, *new_docs.values()]
    ids = sorted(p["id"] for p in context)
    digest = hashlib.sha1("|".join(ids).encode()).hexdigest()[:10]
    metadata = {
        **state.metadata,
        CONTEXT_KEY: context,
        TREE_KEY: pruned.to_records(),
        ROOT_KEY: root_id(state),
        ROUND_KEY: round_index,
    }
    return Example(
        id=f"{root_id(state)}@r{round_index}-{digest}",
        question=state.question,
        answers=list(state.answers),
        supporting_ids=list(state.supporting_ids),
        passages=state.passages,
        decomposition=state.decomposition,
        metadata=metadata,
    )


class RRForest:
    """The training questions of R²AG: the RR-Forest, round by round (a ``Method.task_source``)."""

    def __init__(self, examples: Sequence[Example], seed: int, max_rounds: int = 5) -> None:
        if not examples:
            raise RagrlError("the training set is empty")
        for ex in examples:
            if not ex.supporting_ids:
                raise RagrlError(
                    f"example {ex.id!r}: R²AG trains on gold documents, and it has no supporting_ids"
                )
        self.max_rounds, self.seed = int(max_rounds), int(seed)
        self.round = 0
        self.current: list[Example] = [_root(ex) for ex in examples]
        self.position = 0
        self.next: dict[tuple[str, frozenset[str]], Example] = {}
        self.finished = 0
        """Rollouts that finished (all gold, then stop) so far."""

    def _order(self) -> np.ndarray:
        return np.random.default_rng([self.seed, self.round]).permutation(len(self.current))

    def _advance(self) -> None:
        """Start the next round when this one is used up (its last batch's trees are in by then)."""
        if self.position < len(self.current) or self.round + 1 >= self.max_rounds or not self.next:
            return
        self.round += 1
        self.current, self.next, self.position = list(self.next.values()), {}, 0

    @property
    def done(self) -> bool:
        """This round is used up and leaves no next one (or the round limit is reached)."""
        used_up = self.position >= len(self.current)
        return used_up and (not self.next or self.round + 1 >= self.max_rounds)

    def take(self, k: int) -> list[Example]:
        if self.done:
            raise RagrlError("the RR-Forest is empty: no tree is left to train on")
        self._advance()
        order = self._order()
        out = [self.current[int(i)] for i in order[self.position : self.position + k]]
        self.position = min(self.position + k, len(self.current))
        while len(out) < k:  # the round's last batch: filled with the round's first trees again
            out.extend(self.current[int(i)] for i in order[: k - len(out)])
        return out

    def grow(self, episodes: Sequence[Trajectory], owners: Sequence[Example]) -> list[dict[str, Any]]:
        """The next round's trees left by these rollouts, as records (the same on every process's share)."""
        out = []
        for t, state in zip(episodes, owners, strict=True):
            child = next_state(t, state, self.round + 1)
            out.append({"finished": True} if child is None else child.to_record())
        return out

    def add(self, records: Sequence[dict[str, Any]]) -> None:
        for record in records:
            if record.get("finished"):
                self.finished += 1
                continue
            child = Example.from_record(record)
            self.next.setdefault(state_key(child), child)

    def metrics(self) -> dict[str, float]:
        return {
            "forest/round": float(self.round),
            "forest/trees": float(len(self.current)),
            "forest/next": float(len(self.next)),
            "forest/finished": float(self.finished),
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "round": self.round,
            "position": self.position,
            "finished": self.finished,
            "current": [ex.to_record() for ex in self.current],
            "next": [ex.to_record() for ex in self.next.values()],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state["seed"]) != self.seed:
            raise RagrlError(
                f"checkpoint forest was seeded {state['seed']}, this run {self.seed}: resume with the "
                "same seed"
            )
        self.round, self.position = int(state["round"]), int(state["position"])
        self.finished = int(state.get("finished", 0))
        self.current = [Example.from_record(r) for r in state["current"]]
        self.next = {}
        for r in state["next"]:
            ex = Example.from_record(r)
            self.next[state_key(ex)] = ex


def _root(example: Example) -> Example:
    metadata = {k: v for k, v in example.metadata.items() if k not in (CONTEXT_KEY, TREE_KEY)}
    metadata.update({ROOT_KEY: example.id, ROUND_KEY: 0})
    return Example(
        id=example.id,
        question=example.question,
        answers=list(example.answers),
        supporting_ids=list(example.supporting_ids),
        passages=example.passages,
        decomposition=example.decomposition,
        metadata=metadata,
    )
