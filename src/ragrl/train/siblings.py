"""Sibling candidates at every visited state, and the preference pairs they make (EVO-RAG §3.1-3.2).

A step-wise episode (``rollout.kind: stepwise``) records, for each of its steps, the context the policy
saw. ``sample_siblings`` returns to every such state and samples ``n_candidates - 1`` more actions there
(one batched generate call for all states), beside the one the episode took (Algorithm 1 follows the
sampled action). Candidates with the same action kind and normalised text are merged. Each candidate
becomes a *branch*: the episode's record up to the state, then the candidate's turn and, for a search,
the passages it retrieves (one batched retriever call). Every branch is scored with the method's own
reward in one call, so a candidate's value is exactly what the reward says of that step:

* ``step_reward``: its step's ``R_t``; ``prefix_return``: ``R(x)``, the branch's return up to and
  including the candidate (``return_mode: prefix``, the default; the shared prefix cancels in a pair);
* ``rollout_return``: with ``return_mode: rollout``, the return of the branch played on to its end by
  the policy (``StepwiseRollout.resume``), so the answer a search leads to counts for the search;
* ``weighted``: each component's ``w_k(t)·r_k(t)`` at that step (for per-component reward-model labels).

``reward_model_pairs`` keeps every pair of siblings whose returns differ by at least ``threshold``
(EVO-RAG's Δ = 0.3); ``policy_pairs`` one pair per state, the best and the worst sibling, when they
differ by at least ``margin`` (δ = 0.2). Pair ids are ``<question id>#<group>.<step>.<i>.<j>`` (the
episode's group: its place in the whole batch), so a held-out split keeps a question's pairs together.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

from ragrl.data.schema import Example
from ragrl.errors import RagrlError
from ragrl.rewards.registry import RewardContext
from ragrl.rollout.backtrack import active_steps
from ragrl.rollout.engine import episode_seed, turn_seed
from ragrl.rollout.protocol import read_turn, squash_ws
from ragrl.rollout.sample import PreferencePair, Sample
from ragrl.rollout.trajectory import Action, Segment, Trajectory
from ragrl.train.reward_model import RewardPair

SIBLING_STEP = 50_000
"""Offset of the siblings' seed stream (never a turn index of the rollout itself)."""
SIBLING_STEPS = 1_000
"""More steps than any episode has: the sample indices of one episode's candidates never meet another
episode's of the same group."""


@dataclass
class Candidate:
    token_ids: list[int]
    logprobs: list[float]
    text: str
    action: Action
    branch: Trajectory
    sampled: bool = False
    """The action the episode itself took at this state."""
    step_reward: float = 0.0
    prefix_return: float = 0.0
    rollout_return: float = 0.0
    """The return of the branch played to its end (``return_mode: rollout``; else the prefix return)."""
    weighted: dict[str, float] = field(default_factory=dict)
    rm_score: float = 0.0
    """The reward model's score of the candidate (the mean of its heads), when a cycle computes it."""


@dataclass
class VisitedState:
    episode: int
    step: int
    example: Example
    prompt_ids: list[int]
    """The episode's prompt and the context the policy saw at this step."""
    candidates: list[Candidate] = field(default_factory=list)
    group: int | None = None
    """The episode's group (its question's place in the whole batch, ``Trajectory.metadata["group"]``);
    ``episode`` is its index in this process's list."""
    sample: int = 0
    """The episode's sample within its group."""

    @property
    def pair_prefix(self) -> str:
        """``<question id>#<group>.<step>`` (``#<group>.<sample>.<step>`` past a group's first sample):
        the same on whichever process played the episode."""
        group = self.episode if self.group is None else self.group
        sample = f"{self.sample}." if self.sample else ""
        return f"{self.example.id}#{group}.{sample}{self.step}"


def _branch(
    episode: Trajectory, step: int, segments: list[Segment], action: Action, final: bool
) -> Trajectory:
    """A branch: ``segments`` (the episode's record up to the state, then a candidate's turn and what
    followed it) with the episode's actions before ``step`` and the candidate's ``action``."""
    contexts = episode.metadata["contexts"]
    return Trajectory(
        episode.example_id,
        list(episode.prompt_ids),
        segments=list(segments),
        actions=[*[dataclasses.replace(a) for a in episode.actions[:step]], action],
        final_answer=action.content if final else None,
        finish_reason="answer" if final else "",
        metadata={
            "group": episode.metadata.get("group", 0),
            "contexts": [list(c) for c in contexts[: step + 1]],
        },
    )


def _policy_at(episode: Trajectory) -> list[int]:
    return [i for i, s in enumerate(episode.segments) if s.kind == "policy"]


def visited_states(
    rollout: Any, episodes: Sequence[Trajectory], examples: Sequence[Example]
) -> list[VisitedState]:
    """One state per step of every episode, holding the step's own action as its first candidate; the
    state's prompt is the step's training sample's (``StepwiseRollout.samples``: the context the policy
    saw, token for token)."""
    for episode in episodes:
        if not rollout.keeps_step_contexts or len(_policy_at(episode)) != len(episode.actions):
            raise RagrlError(
                f"sibling candidates need a step-wise episode (one action and one recorded context per "
                f"step); the episode of {episode.example_id!r} is not one"
            )
    states = []
    for sample in rollout.samples(episodes):
        episode, t = episodes[sample.episode], sample.step
        policy_at = _policy_at(episode)
        end = policy_at[t + 1] if t + 1 < len(policy_at) else len(episode.segments)
        action = dataclasses.replace(episode.actions[t])
        own = _branch(episode, t, episode.segments[:end], action, rollout.protocol.is_final(action))
        text = episode.segments[policy_at[t]].text
        group = int(episode.metadata.get("group", sample.episode))
        index = int(episode.metadata.get("sample", 0))
        state = VisitedState(
            sample.episode, t, examples[sample.episode], sample.prompt_ids, group=group, sample=index
        )
        state.candidates.append(
            Candidate(sample.completion_ids, sample.completion_logprobs, text, action, own, sampled=True)
        )
        states.append(state)
    return states


def _key(action: Action) -> tuple[str, str]:
    return action.kind, squash_ws(action.content).lower()


def sample_siblings(
    method: Any,
    backend: Any,
    retriever: Any,
    episodes: Sequence[Trajectory],
    examples: Sequence[Example],
    *,
    n_candidates: int,
    temperature: float,
    seed: int,
    ctx: RewardContext | None = None,
    return_mode: str = "prefix",
) -> list[VisitedState]:
    """Every visited state with its distinct candidates (the episode's own action first), each scored
    as a branch with ``method.reward`` (see the module docstring)."""
    if n_candidates < 2:
        raise RagrlError(f"n_candidates must be >= 2 (a pair needs two siblings), got {n_candidates}")
    protocol, rollout = method.protocol, method.rollout
    engine = method.make_rollout(backend, retriever)
    if return_mode not in ("prefix", "rollout"):
        raise RagrlError(f"return_mode is prefix or rollout, got {return_mode!r}")
    if return_mode == "rollout" and not hasattr(engine, "resume"):
        raise RagrlError(f"return_mode rollout needs a rollout that resumes episodes (stepwise): {engine!r}")
    states = visited_states(engine, episodes, examples)
    extra = n_candidates - 1
    prompts = [s.prompt_ids for s in states for _ in range(extra)]
    seeds = tuple(
        episode_seed(seed, SIBLING_STEP + s.step, *_stream(episodes[s.episode], 0, j, extra))
        for s in states
        for j in range(extra)
    )
    params = dataclasses.replace(rollout, temperature=temperature).sampling(
        rollout.max_new_tokens, protocol.stop, turn_seed(seed, SIBLING_STEP), seeds
    )
    generations = backend.generate(prompts, params) if prompts else []
    tokenizer = backend.tokenizer
    searches: list[tuple[Candidate, Action]] = []
    for n, state in enumerate(states):
        episode = episodes[state.episode]
        before = episode.segments[: _policy_at(episode)[state.step]]
        seen = {_key(state.candidates[0].action)}
        hops = len(active_steps(episode.actions, state.step))
        for gen in generations[n * extra : (n + 1) * extra]:
            ids = [int(t) for t in gen.token_ids]
            text = tokenizer.decode(ids, skip_special_tokens=False)
            action, _ = read_turn(  # as the live rollout reads it
                protocol, text, state.step, hops, fallback=rollout.answers_invalid, tokenizer=tokenizer
            )
            if _key(action) in seen:
                continue
            seen.add(_key(action))
            logprobs = [float(x) for x in gen.logprobs] if gen.logprobs is not None else [0.0] * len(ids)
            segment = Segment("policy", ids, text, logprobs=logprobs, finish_reason=gen.finish_reason)
            branch = _branch(episode, state.step, [*before, segment], action, protocol.is_final(action))
            candidate = Candidate(ids, logprobs, text, action, branch)
            state.candidates.append(candidate)
            if protocol.is_search(action) and action.error is None:
                why = _not_executed(state.step, gen.finish_reason, rollout, retriever)
                if why:
                    action.error = why  # as the engine would leave it: recorded, not run
                else:
                    searches.append((candidate, action))
            elif action.kind == "invalid":
                branch.segments.append(_env(protocol.corrective(action), tokenizer))
    if searches:
        results = retriever.search([a.content for _, a in searches], rollout.k)
        for (candidate, action), hits in zip(searches, results, strict=True):
            action.retrieved_ids = [h.id for h in hits]
            action.retrieved_scores = [float(h.score) for h in hits]
            action.retrieved_titles = [h.passage.title for h in hits]
            candidate.branch.segments.append(_env(protocol.observation(action, hits), tokenizer))
    completed = None
    if return_mode == "rollout":
        candidates = [c for s in states for c in s.candidates]
        for s in states:
            for i, c in enumerate(s.candidates):  # its own sampling stream
                group, sample = _stream(episodes[s.episode], 1 + s.step, i, n_candidates)
                c.branch.metadata.update(group=group, sample=sample)
        completed = engine.resume(
            [c.branch for c in candidates], [s.example for s in states for _ in s.candidates], seed=seed + 1
        )
    _score(method, states, ctx or RewardContext(), completed)
    return states


def _stream(episode: Trajectory, step: int, i: int, per_step: int) -> tuple[int, int]:
    """The ``(group, sample)`` that seed candidate ``i`` of ``per_step`` at ``step`` (counted from 1 for
    the played-on branches): the episode's group and, within it, a sample index of its own. Both come
    from the episode's identity, not from its place in this process's list, so the siblings sample the
    same tokens whichever process plays the episode (a cycle split over processes)."""
    own = int(episode.metadata.get("sample", 0))
    return int(episode.metadata.get("group", 0)), (own * SIBLING_STEPS + step) * per_step + i


def _not_executed(step: int, finish: str, rollout: Any, retriever: Any) -> str:
    """Why the engine would not run a search written at ``step`` (empty: it would): the engine's rule."""
    if retriever is None:
        return "no retriever"
    if step >= rollout.max_turns or (step + 1 >= rollout.max_turns and not rollout.final_answer_turn):
        return "not executed: no turn left"
    if finish == "eos":
        return "not executed: the turn ended with EOS"
    return ""


def _env(text: str, tokenizer: Any) -> Segment:
    return Segment("env", list(tokenizer.encode(text, add_special_tokens=False)), text)


def _score(
    method: Any, states: list[VisitedState], ctx: RewardContext, completed: list[Trajectory] | None
) -> None:
    """Score every branch in one call: its step's R_t, its return so far and each weighted component;
    and, when the branches were played on (``completed``), the return of each to its end."""
    pairs = [(s, c) for s in states for c in s.candidates]
    examples = [s.example for s, _ in pairs]
    results = method.reward.score([c.branch for _, c in pairs], examples, ctx)
    ends = method.reward.score(completed, examples, ctx) if completed is not None else results
    for (state, c), result, end in zip(pairs, results, ends, strict=True):
        if result.steps is None or end.steps is None:
            raise RagrlError("sibling candidates need a per-step reward (R_t for every step)")
        t = state.step
        c.step_reward, c.prefix_return, c.rollout_return = result.steps[t], sum(result.steps), sum(end.steps)
        c.weighted = {k: result.step_weights[k][t] * v[t] for k, v in result.step_components.items()}


# --- preference pairs -----------------------------------------------------------------------------------


def _pair(state: VisitedState, i: int, j: int, margin: float) -> PreferencePair:
    def side(c: Candidate) -> Sample:
        return Sample(
            list(state.prompt_ids),
            list(c.token_ids),
            [1] * len(c.token_ids),
            list(c.logprobs),
            group=state.episode,
            step=state.step,
            example_id=state.example.id,
        )

    chosen, rejected = state.candidates[i], state.candidates[j]
    return PreferencePair(side(chosen), side(rejected), margin, f"{state.pair_prefix}.{i}.{j}")


def _ordered(state: VisitedState, a: int, b: int, score: str) -> tuple[int, int, float]:
    ra, rb = getattr(state.candidates[a], score), getattr(state.candidates[b], score)
    return (a, b, ra - rb) if ra >= rb else (b, a, rb - ra)


def reward_model_pairs(
    states: Sequence[VisitedState],
    threshold: float,
    labels: str = "shared_total",
    score: str = "prefix_return",
) -> list[RewardPair]:
    """Every pair of siblings at a state whose returns differ by at least ``threshold``. ``labels``:
    ``shared_total`` (every head takes the pair's order, the paper's loss) or ``per_component`` (head
    k is ordered by its own weighted component, with the same threshold; 0 where it is not met; a pair
    is kept when some head has a label). ``score``: the return that orders them (``prefix_return`` or
    ``rollout_return``)."""
    if labels not in ("shared_total", "per_component"):
        raise RagrlError(f"reward-model labels are shared_total or per_component, got {labels!r}")
    out = []
    for state in states:
        for a, b in combinations(range(len(state.candidates)), 2):
            i, j, gap = _ordered(state, a, b, score)
            if labels == "shared_total":
                if gap >= threshold:
                    out.append(RewardPair(_pair(state, i, j, gap)))
                continue
            ci, cj = state.candidates[i].weighted, state.candidates[j].weighted
            signs = {
                k: (1.0 if ci[k] - cj[k] >= threshold else -1.0 if cj[k] - ci[k] >= threshold else 0.0)
                for k in ci
            }
            if any(signs.values()):
                out.append(RewardPair(_pair(state, i, j, gap), signs))
    return out


def policy_pairs(
    states: Sequence[VisitedState], margin: float, score: str = "prefix_return"
) -> list[PreferencePair]:
    """One pair per state: its best and worst sibling by ``score`` (the true return, ``prefix_return``
    or ``rollout_return``, or ``rm_score``), kept when they differ by at least ``margin``."""
    out = []
    for state in states:
        if len(state.candidates) < 2:
            continue
        values = [float(getattr(c, score)) for c in state.candidates]
        best = max(range(len(values)), key=lambda i: (values[i], -i))
        worst = min(range(len(values)), key=lambda i: (values[i], i))
        if values[best] - values[worst] >= margin:
            out.append(_pair(state, best, worst, values[best] - values[worst]))
    return out
