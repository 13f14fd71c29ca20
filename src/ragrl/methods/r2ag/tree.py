"""R²AG's Reasoning-Augmented Retrieval Tree (§1): its vertices, how a query finds its parent, the
steps of a grown tree as training samples (``split_steps``), and what a tree measured.

A tree (``RRT``) is rooted at the question; each vertex holds one query the steering model wrote, its
type (base or predicted), its depth (the steering step, from 1), its parent and the documents one
retrieval call returned. ``RRT.documents`` flattens the tree into D_s: every retrieved document once, in
retrieval order (step, then the query's written position, then rank).

One steering call per step reads the question and one global context, every document found so far
(spec §1.5, the reading under which LLM calls are bounded by L_MAX-I; §8.2 item 1). A vertex's parent is
[interp] the earlier vertex whose documents share the most words with its query (the branch it
continues), else the root.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ragrl.data.schema import Example
from ragrl.errors import RagrlError
from ragrl.methods.r2ag.protocol import (
    PREDICTED,
    context_passages,
    step_records,
)
from ragrl.rollout.trajectory import Trajectory

TREE_KEY = "r2ag_tree"
"""``Trajectory.metadata`` / ``Example.metadata`` key of a tree's vertices (``Vertex.to_dict`` records)."""


@dataclass
class Vertex:
    query: str
    kind: str
    """``base-Q`` or ``predicted-Q``."""
    depth: int
    """The steering step that wrote it, from 1."""
    parent: int
    """Index of the parent vertex in ``RRT.vertices``; -1 is the root (the question)."""
    docs: list[dict[str, str]] = field(default_factory=list)
    """The documents its one retrieval call returned (``{id, title, text}``, rank order)."""
    new_gold: int = 0
    """Edge weight in training: gold documents this retrieval found first."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "query": self.query,
            "kind": self.kind,
            "depth": self.depth,
            "parent": self.parent,
            "docs": [dict(d) for d in self.docs],
            "new_gold": self.new_gold,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Vertex:
        return cls(
            str(d["query"]), str(d["kind"]), int(d["depth"]), int(d["parent"]),
            [dict(x) for x in d.get("docs", [])], int(d.get("new_gold", 0)),
        )  # fmt: skip


_WORD = re.compile(r"\w+")


_FUNCTION_WORDS = frozenset(
    "the and for was were are is of in on at to by with from what which who whom whose where when why how "
    "did does do has have had that this these those its his her their an a as or be been being into "
    "about than then there here also not".split()
)


def _words(text: str) -> set[str]:
    """The content words of ``text`` (lower-cased; function words and one- or two-letter words left out)."""
    return {w for w in (x.lower() for x in _WORD.findall(text)) if len(w) > 2 and w not in _FUNCTION_WORDS}


@dataclass
class RRT:
    """A Reasoning-Augmented Retrieval Tree (Definition 2.1)."""

    question: str
    vertices: list[Vertex] = field(default_factory=list)

    def parent_for(self, query: str, depth: int) -> int:
        """The earlier vertex whose documents share the most content words with ``query`` (ties: the
        latest), else the root (-1)."""
        words, best, best_overlap = _words(query), -1, 0
        for i, v in enumerate(self.vertices):
            if v.depth >= depth:
                continue
            text = " ".join(f"{d['title']} {d['text']}" for d in v.docs)
            overlap = len(words & _words(text))
            if overlap and overlap >= best_overlap:
                best, best_overlap = i, overlap
        return best

    def add(self, query: str, kind: str, depth: int, docs: list[dict[str, str]]) -> Vertex:
        vertex = Vertex(query, kind, depth, self.parent_for(query, depth), list(docs))
        self.vertices.append(vertex)
        return vertex

    def documents(self) -> list[dict[str, str]]:
        """D_s: every retrieved document once, in retrieval order."""
        seen: dict[str, dict[str, str]] = {}
        for v in self.vertices:
            for d in v.docs:
                seen.setdefault(d["id"], d)
        return list(seen.values())

    def prune(self) -> RRT:
        """The structurally minimal tree of the branches with positive weight (bottom-up: a vertex stays
        when it or a descendant found new gold), every kept vertex's parent re-indexed."""
        keep = [v.new_gold > 0 for v in self.vertices]
        for i in range(len(self.vertices) - 1, -1, -1):  # children come after their parents
            p = self.vertices[i].parent
            if keep[i] and p >= 0:
                keep[p] = True
        index = {old: new for new, old in enumerate(i for i, k in enumerate(keep) if k)}
        out = RRT(self.question)
        for i, v in enumerate(self.vertices):
            if keep[i]:
                out.vertices.append(
                    Vertex(v.query, v.kind, v.depth, index.get(v.parent, -1), list(v.docs), v.new_gold)
                )
        return out

    def to_records(self) -> list[dict[str, Any]]:
        return [v.to_dict() for v in self.vertices]

    @classmethod
    def from_records(cls, question: str, records: Sequence[dict[str, Any]]) -> RRT:
        return cls(question, [Vertex.from_dict(r) for r in records])


def split_steps(tree: Trajectory) -> list[Trajectory]:
    """A whole tree's steering steps as single-step trajectories, each with the prompt that step was
    generated from and the documents found before it (``prior_ids``): what training samples look like."""
    prompts = tree.metadata.get("step_prompts")
    policy = [s for s in tree.segments if s.kind == "policy"]
    steps = int(tree.metadata.get("steering_steps", 0))
    if prompts is None or len(prompts) != steps:
        raise RagrlError(
            f"trajectory of {tree.example_id!r} has no step prompts: not a tree (rollout.grow: tree)"
        )
    prior = list(tree.metadata.get("prior_ids", []))
    out = []
    for t in range(steps):
        actions = [dataclasses.replace(a, turn=0) for a in tree.actions if a.turn == t and a.kind != "answer"]
        meta = {
            "group": tree.metadata.get("group", 0),
            "sample": 0,
            "protocol": tree.metadata.get("protocol"),
            "prior_ids": list(prior),
            "steering_steps": 1,
            "tree_step": t,
        }
        out.append(
            Trajectory(
                tree.example_id, list(prompts[t]), [policy[t]], actions, finish_reason="step", metadata=meta
            )
        )
        prior += [i for a in actions if a.kind == "search" for i in a.retrieved_ids if i not in prior]
    return out


# -- what a tree measured ------------------------------------------------------------------------------------


def tree_diagnostics(trajectory: Trajectory, example: Example) -> dict[str, float]:
    """Per tree: steering steps (Iter.), LLM calls (steps + the reader), retrieval calls, documents
    retrieved (|D_s|, the @K of a tree), and over D_s: recall, full recall and AP normalised by |g|
    (documents ranked in retrieval order, §5.1 [interp])."""
    records = step_records(trajectory)
    prior = [p["id"] for p in context_passages(example)]
    docs = list(dict.fromkeys([*prior, *(i for r in records for i in r.retrieved)]))
    out = {
        "iterations": float(len(records)),
        "llm_calls": float(len(records) + int(trajectory.metadata.get("reader_calls", 0))),
        "retrievals": float(sum(1 for a in trajectory.actions if a.kind == "search")),
        "pruned_queries": float(sum(1 for a in trajectory.actions if a.kind == "pruned")),
        "predicted_queries": float(
            sum(1 for a in trajectory.actions if a.kind in ("search", "pruned") and a.tag == PREDICTED)
        ),
        "docs": float(len(docs)),
        "stopped": float(any(a.kind == "stop" for a in trajectory.actions)),
        # T_r (steering and retrieval) and T_g (the reader): this tree's share of the batched calls
        "seconds_retrieval": trajectory.timings.get("generate", 0.0)
        + trajectory.timings.get("retrieve", 0.0),
        "seconds_generation": trajectory.timings.get("read", 0.0),
        "invalid_steps": float(sum(1 for a in trajectory.actions if a.kind == "invalid")),
    }
    gold = set(example.supporting_ids)
    if gold:
        found = gold & set(docs)
        out["tree_recall"] = len(found) / len(gold)
        out["tree_full_recall"] = float(found == gold)
        hits, ap = 0, 0.0
        for rank, d in enumerate(docs, 1):
            if d in gold:
                hits += 1
                ap += hits / rank
        out["tree_map"] = ap / len(gold)
    return out
