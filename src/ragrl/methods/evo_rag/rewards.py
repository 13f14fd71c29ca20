"""EVO-RAG's seven step rewards (spec §2.1), one value per step of the episode.

Every component is registered ``per_step``: it returns one raw value per policy turn (step ``t``,
0-based), read from the trajectory's typed actions (``actions[t]`` is the action of step ``t``). The
scheduler (``ragrl.methods.evo_rag.schedule``) weights them, and ``R_t = Σ_k w_k(t)·r_k(t)``.

============  ===================================================================================
``evo_ret``   r_ret: +1 for a SEARCH whose passages meet the gold documents, −1 for one that misses
``evo_act``   r_act: −1 for a SEARCH at p(t) ≥ 0.3 whose max cosine to an earlier sub-query is above
              ``dup_threshold`` (literal: 0, so any overlap counts); 0 before
``evo_dup``   r_dup: −max_{j<t} cos(q_t, q_j) over every earlier sub-query, backtracked ones included;
              0 for the first sub-query and for other actions
``evo_bt``    r_bt: −1 on BACKTRACK
``evo_ref``   r_ref: +1 for a REFUSE when the verifier finds the evidence in context insufficient, −1
              when it finds it sufficient
``evo_step``  r_step: ``cost`` (−1) on every step
``evo_ans``   r_ans: ½(EM + F1) of the final answer at its step (HotpotQA normalisation); 0 on REFUSE
============  ===================================================================================

The evidence D_{≤t} the verifier reads is what is still in the agent's context before step ``t``: the
passages of the searches that no BACKTRACK took back (``active_steps``). The verifier is pluggable
(``verifier``): ``{kind: gold}`` (the offline proxy: every gold document is in the evidence),
``{kind: answer}`` (a gold answer's tokens all occur in the evidence text), ``{kind: corpus}`` (a
deviation: the corpus can answer the question, ``Example.answerable``, whatever is in context), or any
judge client (``ragrl.metrics.judge_clients.make_judge``: an OpenAI-compatible endpoint, a local model, a
cache)
asked for ``{"enough_evidence": "yes"|"no"}``. Verdicts are cached per (question, evidence) and kept on
the trajectory (``metadata["evo_rag"]["verdicts"]``), with each step's max cosine.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from ragrl.data.schema import Example
from ragrl.errors import RagrlError
from ragrl.metrics.answer import cover_em, exact_match, f1
from ragrl.metrics.judge_clients import JudgeClient, complete_all, make_judge, snippet
from ragrl.rewards.registry import RewardContext, register_reward
from ragrl.rollout.backtrack import active_steps
from ragrl.rollout.trajectory import Action, Trajectory

T_MAX = 20
"""The episode cap and the scheduler's horizon (spec §1.4)."""

VERIFIER_SYSTEM = "You check whether retrieved evidence is enough to answer a question."
VERIFIER_TEMPLATE = (
    "Question: {question}\n\nEvidence retrieved so far:\n{evidence}\n\n"
    "Is this evidence enough to answer the question with certainty? Reply with only the JSON "
    '{{"enough_evidence": "yes"}} or {{"enough_evidence": "no"}}.'
)
"""Our wording of the verifier prompt (the paper gives none, spec §1.7); fields ``{question}`` and
``{evidence}`` (one ``Title: text`` line per passage, or ``(none)``)."""

_VERDICT = re.compile(r'"enough_evidence"\s*:\s*"(yes|no)"', re.IGNORECASE)
_MARKUP = re.compile(r"</?[A-Za-z][\w-]*/?>")


# --- reading the episode --------------------------------------------------------------------------------


def executed(action: Action) -> bool:
    """A search the environment ran (parsed, not cut by a budget)."""
    return action.kind == "search" and action.error is None


def step_observations(trajectory: Trajectory) -> list[str]:
    """The environment's text after each step (passages, a corrective; empty for none), its tags
    replaced by spaces."""
    out: list[str] = []
    for segment in trajectory.segments:
        if segment.kind == "policy":
            out.append("")
        elif out:
            out[-1] += _MARKUP.sub(" ", segment.text)
    return out


def evidence_ids(actions: Sequence[Action], t: int) -> list[str]:
    """D_{≤t}: the passage ids of the searches still in context before step ``t``, first seen first."""
    seen: dict[str, None] = {}
    for i in active_steps(actions, t):
        if executed(actions[i]):
            seen.update(dict.fromkeys(actions[i].retrieved_ids))
    return list(seen)


def _check_steps(trajectory: Trajectory) -> int:
    n = sum(1 for s in trajectory.segments if s.kind == "policy")
    if n != len(trajectory.actions) or n == 0:
        raise RagrlError(
            f"EVO-RAG scores one action per step: the episode of {trajectory.example_id!r} has {n} policy "
            f"turns and {len(trajectory.actions)} actions"
        )
    return n


def _gold(example: Example, component: str) -> set[str]:
    gold = set(example.supporting_ids)
    if not gold:
        raise RagrlError(
            f"{component}: example {example.id!r} has no gold documents (supporting_ids); r_ret and the "
            "gold verifier need them"
        )
    return gold


# --- query similarity (r_dup, r_act) ---------------------------------------------------------------------


class QueryEncoder:
    """L2-normalised sentence embeddings of sub-queries (all-MiniLM-L6-v2 by default), cached by text."""

    def __init__(self, model: str | None = None) -> None:
        import sentence_transformers  # noqa: F401 - imports transformers, whose progress bars go quiet next

        from ragrl.console import quiet_libraries
        from ragrl.retrieval.dense import load_encoder, resolve_device, resolve_model_path

        quiet_libraries()
        self.name, path = resolve_model_path(model)
        self.encoder = load_encoder(path, resolve_device("cpu"))
        self.cache: dict[str, np.ndarray] = {}

    def embed(self, texts: Sequence[str]) -> dict[str, np.ndarray]:
        new = sorted({t for t in texts if t not in self.cache})
        if new and len(self.cache) + len(new) > 200_000:  # bounded: a long run writes many queries
            self.cache.clear()
            new = sorted(set(texts))
        if new:
            vectors = self.encoder.encode(
                new, batch_size=64, convert_to_numpy=True, normalize_embeddings=True, show_progress_bar=False
            )
            self.cache.update(zip(new, np.asarray(vectors, dtype=np.float32), strict=True))
        return {t: self.cache[t] for t in texts}


@lru_cache(maxsize=4)
def query_encoder(model: str | None = None) -> QueryEncoder:
    return QueryEncoder(model)


def max_cosines(
    trajectories: Sequence[Trajectory], encoder: str | None = None, keep_embeddings: bool = False
) -> list[list[float | None]]:
    """Per episode and step: for a SEARCH, the largest cosine between its sub-query and any earlier
    sub-query of the episode (backtracked ones included; ``None`` for the first); ``None`` for other
    actions. Every sub-query of the batch is embedded in one call. With ``keep_embeddings`` each
    search's unit-norm query embedding is kept in ``metadata["evo_rag"]["query_embeddings"]`` (for the
    per-step log)."""
    queries = [a.content for t in trajectories for a in t.actions if a.kind == "search" and a.content]
    vectors = query_encoder(encoder).embed(queries) if queries else {}
    out: list[list[float | None]] = []
    for trajectory in trajectories:
        earlier: list[np.ndarray] = []
        row: list[float | None] = []
        kept: list[list[float] | None] = []
        for action in trajectory.actions:
            if action.kind != "search" or not action.content:
                row.append(None)
                kept.append(None)
                continue
            v = vectors[action.content]
            row.append(max(float(v @ e) for e in earlier) if earlier else None)
            kept.append([round(float(x), 6) for x in v])
            earlier.append(v)
        out.append(row)
        info = trajectory.metadata.setdefault("evo_rag", {})
        info["max_cos"] = row
        if keep_embeddings:
            info["query_embeddings"] = kept
    return out


# --- the evidence-sufficiency verifier (r_ref) ----------------------------------------------------------


def parse_verdict(reply: str) -> str | None:
    """``"yes"`` / ``"no"`` from ``{"enough_evidence": ...}`` in the reply; None if absent."""
    match = _VERDICT.search(reply)
    return None if match is None else match.group(1).lower()


@lru_cache(maxsize=8)
def _client(spec_json: str) -> JudgeClient:
    return make_judge(json.loads(spec_json))


_VERDICTS: dict[tuple[str, str, tuple[str, ...], str], str] = {}
"""Judge verdicts by (example id, question, evidence ids, verifier spec); bounded."""
_MAX_CACHED = 100_000


def _evidence_text(trajectory: Trajectory, t: int) -> str:
    """The passages still in context before step ``t``, as the environment showed them."""
    observations = step_observations(trajectory)
    return "\n".join(
        observations[j].strip()
        for j in active_steps(trajectory.actions, t)
        if executed(trajectory.actions[j])
    )


def check_verifier(verifier: dict[str, Any] | None) -> None:
    """A verifier spec's kind, checked when the method loads (a judge's own settings when it is built)."""
    kind = (verifier or {"kind": "gold"}).get("kind")
    if kind in ("gold", "answer", "corpus"):
        if len(verifier or {}) > 1:
            raise RagrlError(
                f"rewards.verifier: kind {kind} takes no settings, got {sorted(set(verifier) - {'kind'})}"
            )
        return
    if kind not in ("openai", "local", "cached"):
        raise RagrlError(
            f"rewards.verifier.kind: gold, answer, corpus, openai, local or cached, got {kind!r}"
        )


def verify(requests: list[tuple[Trajectory, Example, int]], verifier: dict[str, Any] | None) -> list[str]:
    """The verdict (``"yes"``: the evidence suffices) for each (episode, example, step): the evidence is
    what is in context before that step. The proxies are computed every time; a judge's verdicts are
    cached per (example, evidence, verifier)."""
    spec = dict(verifier or {"kind": "gold"})
    check_verifier(spec)
    kind = spec["kind"]
    key = json.dumps(spec, sort_keys=True)
    verdicts: list[str | None] = []
    asks: list[tuple[int, tuple[str, str, tuple[str, ...], str], list[dict[str, str]]]] = []
    for i, (trajectory, example, t) in enumerate(requests):
        if kind == "corpus":  # the question's own answerability: no refusal of an answerable question pays
            verdicts.append("yes" if example.answerable else "no")
            continue
        if kind == "gold":
            verdicts.append(
                "yes" if _gold(example, "evo_ref") <= set(evidence_ids(trajectory.actions, t)) else "no"
            )
            continue
        text = _evidence_text(trajectory, t)
        if kind == "answer":
            verdicts.append("yes" if text and cover_em(text, example.answers) == 1.0 else "no")
            continue
        cache_key = (example.id, example.question, tuple(sorted(evidence_ids(trajectory.actions, t))), key)
        if cache_key in _VERDICTS:
            verdicts.append(_VERDICTS[cache_key])
            continue
        user = VERIFIER_TEMPLATE.format(question=example.question, evidence=text or "(none)")
        asks.append(
            (
                i,
                cache_key,
                [{"role": "system", "content": VERIFIER_SYSTEM}, {"role": "user", "content": user}],
            )
        )
        verdicts.append(None)
    if asks:
        replies = complete_all(_client(key), [chat for _, _, chat in asks])
        if len(_VERDICTS) > _MAX_CACHED:
            _VERDICTS.clear()
        for (i, cache_key, _), reply in zip(asks, replies, strict=True):
            verdict = parse_verdict(reply)
            trajectory, _, t = requests[i]
            trajectory.metadata.setdefault("evo_rag", {}).setdefault("verifier_replies", {})[str(t)] = {
                "reply": snippet(reply),
                "parsed": verdict is not None,
            }
            verdicts[i] = verdict or "yes"  # an unreadable reply does not reward the refusal
            if verdict is not None:
                _VERDICTS[cache_key] = verdict
    for (trajectory, _, t), verdict in zip(requests, verdicts, strict=True):
        trajectory.metadata.setdefault("evo_rag", {}).setdefault("verdicts", {})[str(t)] = verdict
    return [str(v) for v in verdicts]


# --- the seven components -------------------------------------------------------------------------------


@register_reward("evo_ret", per_step=True)
def retrieval_bonus(
    trajectory: Trajectory,
    example: Example,
    ctx: RewardContext,
    top_k: int | None = None,
    novel_hits_only: bool = False,
) -> list[float]:
    """r_ret: ±1 for an executed SEARCH by whether its passages (the first ``top_k``) meet the gold
    documents; with ``novel_hits_only`` a gold document found at an earlier step does not count again."""
    _check_steps(trajectory)
    gold = _gold(example, "evo_ret")
    found: set[str] = set()
    out = []
    for action in trajectory.actions:
        if not executed(action):
            out.append(0.0)
            continue
        ids = set(action.retrieved_ids[:top_k] if top_k else action.retrieved_ids)
        hits = (ids & gold) - found if novel_hits_only else ids & gold
        out.append(1.0 if hits else -1.0)
        found |= ids & gold
    return out


@register_reward("evo_dup", per_step=True, batched=True)
def overlap_penalty(
    trajectories: Sequence[Trajectory],
    examples: Sequence[Example],
    ctx: RewardContext,
    encoder: str | None = None,
    clip_at_zero: bool = False,
    log_embeddings: bool = False,
) -> list[list[float]]:
    """r_dup: −max cosine of a SEARCH's sub-query to the earlier ones (0 for the first; a negative
    cosine is a small bonus unless ``clip_at_zero``). ``log_embeddings`` keeps each query's embedding
    for the per-step log."""
    for trajectory in trajectories:
        _check_steps(trajectory)
    out = []
    for row in max_cosines(trajectories, encoder, keep_embeddings=log_embeddings):
        values = [0.0 if c is None else -c for c in row]
        out.append([min(v, 0.0) for v in values] if clip_at_zero else values)
    return out


@register_reward("evo_act", per_step=True, batched=True)
def action_penalty(
    trajectories: Sequence[Trajectory],
    examples: Sequence[Example],
    ctx: RewardContext,
    encoder: str | None = None,
    progress: float = 0.3,
    dup_threshold: float = 0.0,
    denominator: str = "t_max",
    t_max: int = T_MAX,
) -> list[list[float]]:
    """r_act: −1 for a SEARCH at p(t) ≥ ``progress`` whose max cosine to an earlier sub-query exceeds
    ``dup_threshold`` (the literal ``1[r_dup < 0]``: any positive overlap); p(t) = t / ``t_max``, or
    t / (the episode's steps) with ``denominator: episode``."""
    if denominator not in ("t_max", "episode"):
        raise RagrlError(f"evo_act.denominator is t_max or episode, got {denominator!r}")
    out = []
    for trajectory, row in zip(trajectories, max_cosines(trajectories, encoder), strict=True):
        n = _check_steps(trajectory)
        horizon = t_max if denominator == "t_max" else n
        out.append(
            [
                -1.0 if c is not None and t / horizon >= progress and c > dup_threshold else 0.0
                for t, c in enumerate(row)
            ]
        )
    return out


@register_reward("evo_bt", per_step=True)
def backtrack_penalty(trajectory: Trajectory, example: Example, ctx: RewardContext) -> list[float]:
    """r_bt: −1 on every BACKTRACK."""
    _check_steps(trajectory)
    return [-1.0 if a.kind == "backtrack" else 0.0 for a in trajectory.actions]


@register_reward("evo_ref", per_step=True, batched=True)
def refusal_reward(
    trajectories: Sequence[Trajectory],
    examples: Sequence[Example],
    ctx: RewardContext,
    verifier: dict[str, Any] | None = None,
) -> list[list[float]]:
    """r_ref: +1 for a REFUSE the verifier backs (the evidence in context is not enough), −1 otherwise."""
    requests = []
    for trajectory, example in zip(trajectories, examples, strict=True):
        _check_steps(trajectory)
        requests += [(trajectory, example, t) for t, a in enumerate(trajectory.actions) if a.kind == "refuse"]
    verdicts = iter(verify(requests, verifier))
    return [
        [(1.0 if next(verdicts) == "no" else -1.0) if a.kind == "refuse" else 0.0 for a in trajectory.actions]
        for trajectory in trajectories
    ]


@register_reward("evo_step", per_step=True)
def step_cost(
    trajectory: Trajectory, example: Example, ctx: RewardContext, cost: float = -1.0
) -> list[float]:
    """r_step: ``cost`` on every step (the paper's −1; −0.5 and −2 were its ablation)."""
    return [float(cost)] * _check_steps(trajectory)


@register_reward("evo_ans", per_step=True)
def answer_reward(
    trajectory: Trajectory, example: Example, ctx: RewardContext, variant: str = "squad"
) -> list[float]:
    """r_ans: ½(EM + F1) of the final answer, at the step that gave it (ANSWER, or the forced answer of a
    truncated episode); 0 elsewhere, and 0 for a REFUSE."""
    n = _check_steps(trajectory)
    out = [0.0] * n
    last = trajectory.actions[-1]
    if last.kind == "answer" and trajectory.final_answer is not None:
        em = exact_match(trajectory.final_answer, example.answers, variant)
        out[-1] = 0.5 * (em + f1(trajectory.final_answer, example.answers, variant)[0])
    return out


def step_log(trajectory: Trajectory) -> list[dict[str, Any]]:
    """Each step's action as the per-step log shows it: kind, query or answer, passage ids and titles,
    the max cosine to earlier sub-queries, the query's embedding (with ``rewards.log_embeddings``) and
    the verifier's verdict (where computed)."""
    info = trajectory.metadata.get("evo_rag", {})
    cos = info.get("max_cos") or [None] * len(trajectory.actions)
    embeddings = info.get("query_embeddings") or [None] * len(trajectory.actions)
    verdicts = info.get("verdicts", {})
    out = []
    for t, action in enumerate(trajectory.actions):
        row: dict[str, Any] = {"kind": action.kind, "text": action.content}
        if action.kind == "search":
            row.update(doc_ids=action.retrieved_ids, titles=action.retrieved_titles)
            row["max_cos"] = None if cos[t] is None or not math.isfinite(cos[t]) else round(cos[t], 4)
            if embeddings[t] is not None:
                row["embedding"] = embeddings[t]
        if action.error:
            row["error"] = action.error
        if str(t) in verdicts:
            row["verdict"] = verdicts[str(t)]
        out.append(row)
    return out
