"""The rollout that grows R²AG's trees (``rollout.kind: r2ag``; the tree is ``ragrl.methods.r2ag.tree``).

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

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ragrl.data.schema import Example
from ragrl.errors import RagrlError
from ragrl.llm.backend import Generation
from ragrl.llm.chat import encode_messages
from ragrl.methods.r2ag.protocol import (
    BASE,
    PREDICTED,
    R2agProtocol,
    R2agRolloutConfig,
    Steering,
    context_passages,
    parse_steering,
    step_actions,
)
from ragrl.methods.r2ag.tree import RRT, TREE_KEY
from ragrl.rollout.engine import episode_seed, turn_seed
from ragrl.rollout.protocol import find_spans, squash_ws
from ragrl.rollout.registry import register_rollout
from ragrl.rollout.sample import Sample
from ragrl.rollout.trajectory import Action, Segment, Trajectory


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
        steer = getattr(self.backend, "steer_batch", None)  # a scripted steerer (ragrl.methods.r2ag.steering)
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


__all__ = ["R2agRollout", "reader_answer"]
