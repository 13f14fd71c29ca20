"""R²AG's Reasoning-Augmented Retrieval Tree (§1) and the rollout that grows it (``rollout.kind: r2ag``).

A tree (``RRT``) is rooted at the question; each vertex holds one query the steering model wrote, its
type (base or predicted), its depth (the steering step, from 1), its parent and the documents one
retrieval call returned. ``RRT.documents`` flattens the tree into D_s: every retrieved document once, in
retrieval order (step, then the query's written position, then rank).

One steering call per step reads the question and one global context, every document found so far
(spec §1.5, the reading under which LLM calls are bounded by L_MAX-I; §8.2 item 1). A vertex's parent is
[interp] the earlier vertex whose documents share the most words with its query (the branch it
continues), else the root.

``R2agRollout.run`` plays either (``rollout.grow``):

* ``step`` (training): one expansion of each given tree state, ``n`` samples of it, one group per
  (tree, step). Every candidate query is retrieved at top-``train_k`` (Eq. 5 scores all of them), and the
  documents never enter the output: each sample is one single-turn sequence, ``q ⊕ d̃`` → the steering
  text, with the loss on every generated token;
* ``tree`` (evaluation): whole trees, up to ``max_iterations`` steps. Top-Survivor keeps the first
  ``top_t`` base and ``top_t_pred`` predicted queries of a step (none of the predicted ones with
  ``use_pred: false``, R²AG_base) and retrieves top-``k`` for each. A tree ends when the model writes
  ``stop retrieval`` (the queries written beside it are still retrieved, §8.2 items 2 and 4), writes
  nothing readable, or reaches ``max_iterations``. With ``read``, the policy then answers from D_s (the
  generator).

Scripted steering (``SteeringOracle``, ``SingleStepSteering``) plays through the same rollout with a
``SteererBackend``: the same parse, retrieval, tree and metrics as a model.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ragrl.data.schema import Example
from ragrl.errors import RagrlError
from ragrl.llm.backend import Generation
from ragrl.llm.chat import encode_messages
from ragrl.methods.r2ag_protocol import (
    BASE,
    PREDICTED,
    R2agProtocol,
    R2agRolloutConfig,
    Steering,
    context_passages,
    parse_steering,
    step_actions,
    step_records,
)
from ragrl.rollout.engine import episode_seed, turn_seed
from ragrl.rollout.protocol import find_spans, squash_ws
from ragrl.rollout.registry import register_rollout
from ragrl.rollout.sample import Sample
from ragrl.rollout.trajectory import Action, Segment, Trajectory

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


# --- the rollout ------------------------------------------------------------------------------------


@dataclass
class _TreeEpisode:
    example: Example
    traj: Trajectory
    tree: RRT
    context: list[dict[str, str]]
    start: int = 0
    """How many vertices the state's tree had when the rollout began."""
    history: list[Steering] = field(default_factory=list)
    done: bool = False

    @property
    def depth(self) -> int:
        """The depth the state's own tree reached before this rollout (0 at the root)."""
        return max((v.depth for v in self.tree.vertices[: self.start]), default=0)

    @property
    def asked(self) -> set[str]:
        """The queries this rollout has retrieved (not those Top-Survivor left out)."""
        return {a.content for a in self.traj.actions if a.kind == "search"}


def _doc(hit: Any) -> dict[str, str]:
    return {"id": hit.passage.id, "title": hit.passage.title, "text": hit.passage.text}


@register_rollout("r2ag")
class R2agRollout:
    def __init__(
        self, backend: Any, retriever: Any, protocol: R2agProtocol, config: R2agRolloutConfig
    ) -> None:
        if not isinstance(config, R2agRolloutConfig):
            raise RagrlError("rollout.kind r2ag needs the R²AG rollout settings (method: r2ag)")
        if retriever is None:
            raise RagrlError("R²AG retrieves for every query it writes: give it an index")
        self.backend, self.retriever, self.protocol, self.config = backend, retriever, protocol, config
        self.tokenizer = backend.tokenizer

    def _prompt(self, ep: _TreeEpisode) -> list[int]:
        return encode_messages(self.protocol.messages(ep.example, ep.context), self.tokenizer)

    def run(
        self,
        examples: Sequence[Example],
        n: int | None = None,
        seed: int | None = None,
        *,
        first_group: int = 0,
    ) -> list[Trajectory]:
        cfg = self.config
        n = cfg.n if n is None else n
        seed = cfg.seed if seed is None else seed
        t0 = time.perf_counter()
        episodes = []
        for g, ex in enumerate(examples):
            context = context_passages(ex)
            tree = RRT.from_records(ex.question, ex.metadata.get(TREE_KEY) or [])
            for s in range(n):
                ep = _TreeEpisode(
                    ex,
                    Trajectory(
                        ex.id,
                        [],
                        metadata={"group": first_group + g, "sample": s, "protocol": self.protocol.name},
                    ),
                    RRT(tree.question, list(tree.vertices)),
                    list(context),
                    start=len(tree.vertices),
                )
                ep.traj.prompt_ids = self._prompt(ep)
                ep.traj.metadata["prior_ids"] = [p["id"] for p in context]
                if len(ep.traj.prompt_ids) > cfg.max_prompt_tokens:
                    raise RagrlError(
                        f"example {ex.id!r}: the steering prompt has {len(ep.traj.prompt_ids)} tokens, over "
                        f"rollout.max_prompt_tokens ({cfg.max_prompt_tokens})"
                    )
                episodes.append(ep)
        steps = 1 if cfg.grow == "step" else cfg.max_iterations
        for it in range(steps):
            active = [ep for ep in episodes if not ep.done]
            if not active:
                break
            self._expand(active, it, seed)
        for ep in episodes:
            ep.traj.metadata["steering_steps"] = len(ep.history)
            if not ep.done:
                ep.traj.finish_reason = "max_iterations" if cfg.grow == "tree" else "step"
                ep.traj.truncated = cfg.grow == "tree"
        if cfg.read and cfg.grow == "tree":
            self._read(episodes, seed)
        for ep in episodes:
            ep.traj.metadata[TREE_KEY] = ep.tree.to_records()
            ep.traj.timings["total"] = time.perf_counter() - t0
        return [ep.traj for ep in episodes]

    def _generate(
        self,
        active: list[_TreeEpisode],
        prompts: list[list[int]],
        it: int,
        seed: int | None,
        max_new: int,
        stop: tuple[str, ...] = (),
        *,
        reading: bool = False,
    ) -> list[Generation]:
        """One batched generation: the steering step of every active tree (a scripted steerer plays it
        from the trees' states), or with ``reading`` the reader's answers (always a model)."""
        cfg = self.config
        seeds = None
        if seed is not None:
            seeds = tuple(
                episode_seed(seed, it, ep.traj.metadata["group"], ep.traj.metadata["sample"]) for ep in active
            )
        params = cfg.sampling(max_new, stop, turn_seed(seed, it), seeds)
        steer = getattr(self.backend, "steer_batch", None)  # a scripted steerer (ragrl.methods.r2ag_steering)
        if steer is not None and not reading:
            gens = steer(active, params)
        else:
            gens = self.backend.generate(prompts, params)
        if len(gens) != len(active):
            raise RagrlError(f"backend returned {len(gens)} generations for {len(active)} prompts")
        return gens

    def _expand(self, active: list[_TreeEpisode], it: int, seed: int | None) -> None:
        """One steering step of every active tree: generate, parse, retrieve the survivors, grow."""
        cfg = self.config
        training = cfg.grow == "step"
        prompts = [ep.traj.prompt_ids if it == 0 else self._prompt(ep) for ep in active]
        # a later step's prompt holds every document found so far: a tree whose prompt outgrows the
        # budget ends there (the first step's prompt is checked when the tree starts)
        fits = [len(p) <= cfg.max_prompt_tokens for p in prompts]
        for ep, ok in zip(active, fits, strict=True):
            if not ok:
                ep.done, ep.traj.finish_reason, ep.traj.truncated = True, "prompt_limit", True
        active = [ep for ep, ok in zip(active, fits, strict=True) if ok]
        prompts = [p for p, ok in zip(prompts, fits, strict=True) if ok]
        if not active:
            return
        if not training:  # each step's prompt, so a tree splits into trainable steps (split_steps)
            for ep, prompt in zip(active, prompts, strict=True):
                ep.traj.metadata.setdefault("step_prompts", []).append(prompt)
        t = time.perf_counter()
        gens = self._generate(active, prompts, it, seed, cfg.max_new_tokens)
        generate_seconds = time.perf_counter() - t
        plans: list[list[bool]] = []  # per episode, per query of steering.queries: retrieve it?
        for ep, gen in zip(active, gens, strict=True):
            ids = list(gen.token_ids[: cfg.max_new_tokens])
            text = self.tokenizer.decode(ids, skip_special_tokens=False)
            finish = gen.finish_reason if len(ids) == len(gen.token_ids) else "length"
            logprobs = list(gen.logprobs[: len(ids)])
            ep.traj.segments.append(Segment("policy", ids, text, logprobs=logprobs, finish_reason=finish))
            # each tree's share of the batched call: summed over trees, the wall time of the steps
            ep.traj.timings["generate"] = ep.traj.timings.get("generate", 0.0) + generate_seconds / len(
                active
            )
            s = parse_steering(text)
            ep.history.append(s)
            plans.append(self._survivors(s, training))
        k = cfg.train_k if training else cfg.k
        queries = [
            q
            for ep, plan in zip(active, plans, strict=True)
            for (_, q), go in zip(ep.history[-1].queries, plan, strict=True)
            if go
        ]
        t = time.perf_counter()
        found_lists = self.retriever.search(queries, k) if queries else []
        if len(found_lists) != len(queries):
            raise RagrlError(
                f"the retriever returned {len(found_lists)} result lists for {len(queries)} queries"
            )
        results = iter(found_lists)
        retrieve_seconds = time.perf_counter() - t
        for ep, plan in zip(active, plans, strict=True):
            s = ep.history[-1]
            found: list[list[str] | None] = []
            for (tag, q), go in zip(s.queries, plan, strict=True):
                if not go:
                    found.append(None)
                    continue
                docs = [_doc(h) for h in next(results)]
                found.append([d["id"] for d in docs])
                ep.tree.add(q, tag, ep.depth + len(ep.history), docs)
                known = {d["id"] for d in ep.context}
                ep.context.extend(d for d in docs if d["id"] not in known)
            ep.traj.actions.extend(step_actions(s, it, found))
            ep.traj.timings["retrieve"] = ep.traj.timings.get("retrieve", 0.0) + retrieve_seconds / len(
                active
            )
            if s.stop:
                ep.done, ep.traj.finish_reason = True, "stop"
            elif not s.valid:
                ep.done, ep.traj.finish_reason = True, "invalid"
            elif training:
                ep.done, ep.traj.finish_reason = True, "step"

    def _survivors(self, s: Steering, training: bool) -> list[bool]:
        """Which of a step's queries are retrieved: in training every candidate (Eq. 5 scores them all;
        ``survivors_in_training`` applies the cut as at evaluation); at evaluation the first ``top_t``
        base and ``top_t_pred`` predicted ones (no predicted one without ``use_pred``)."""
        cfg = self.config
        if training and not cfg.survivors_in_training:
            return [True] * len(s.queries)
        t_pred = cfg.top_t_pred if cfg.top_t_pred is not None else cfg.top_t
        keep = {
            BASE: cfg.top_t or len(s.base),
            PREDICTED: (t_pred or len(s.predicted)) if cfg.use_pred else 0,
        }
        seen = {BASE: 0, PREDICTED: 0}
        out = []
        for tag, _ in s.queries:
            out.append(seen[tag] < keep[tag])
            seen[tag] += 1
        return out

    def _read(self, episodes: list[_TreeEpisode], seed: int | None) -> None:
        """The generator: answer from D_s (every document the tree retrieved, the state's context first)."""
        cfg = self.config
        prompts = [
            encode_messages(self.protocol.reader_messages(ep.example, ep.context), self.tokenizer)
            for ep in episodes
        ]
        t = time.perf_counter()
        gens = self._generate(
            episodes,
            prompts,
            cfg.max_iterations,
            seed,
            cfg.reader_max_new_tokens,
            ("</answer>",),
            reading=True,
        )
        share = (time.perf_counter() - t) / max(len(episodes), 1)
        for ep, gen in zip(episodes, gens, strict=True):
            ep.traj.timings["read"] = share
            text = self.tokenizer.decode(gen.token_ids, skip_special_tokens=False)
            ep.traj.segments.append(
                Segment(
                    "policy",
                    list(gen.token_ids),
                    text,
                    logprobs=list(gen.logprobs),
                    finish_reason=gen.finish_reason,
                )
            )
            ep.traj.metadata["reader_calls"] = 1
            answer = reader_answer(text, self.tokenizer.decode(gen.token_ids, skip_special_tokens=True))
            if answer:
                ep.traj.actions.append(Action("answer", content=answer, turn=len(ep.history)))
                ep.traj.final_answer = answer

    def samples(self, episodes: Sequence[Trajectory]) -> list[Sample]:
        """One sample per steering step: the state's prompt, then the steering text (all of it trained)."""
        out = []
        for e, t in enumerate(episodes):
            if t.metadata.get("steering_steps", 1) != 1 or t.final_answer is not None:
                raise RagrlError(
                    f"trajectory of {t.example_id!r} is a whole tree: R²AG trains one step at a time "
                    "(rollout.grow: step)"
                )
            seg = t.segments[0]
            out.append(
                Sample(
                    list(t.prompt_ids),
                    list(seg.token_ids),
                    [1] * len(seg.token_ids),
                    list(seg.logprobs or [0.0] * len(seg.token_ids)),
                    group=int(t.metadata.get("group", 0)),
                    episode=e,
                    example_id=t.example_id,
                )
            )
        return out


def reader_answer(text: str, plain: str) -> str | None:
    """The reader's answer: its last ``<answer>`` block, else the first line of its reply without
    special tokens (``plain``): a generator answers in words, tags or not."""
    spans = find_spans(text, "answer")
    if spans:
        return squash_ws(spans[-1].content) or None
    lines = [squash_ws(x) for x in plain.replace("<answer>", "").splitlines() if x.strip()]
    return lines[0] if lines else None


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


# --- what a tree measured ----------------------------------------------------------------------------


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


__all__ = ["RRT", "R2agRollout", "Vertex", "split_steps", "tree_diagnostics"]
