"""Run a policy over a question file with a retriever and score it (the engine behind ``ragrl eval``).

The policy is any ``GenerationBackend`` (a checkpoint through transformers or vLLM, or a scripted
demonstrator); the method supplies the protocol, rollout settings and reward. Decoding is greedy by
default. Scores come from the metrics library (EM, F1, cover-EM, substring accuracy, retrieval recall
of the supporting passages over everything the agent retrieved) plus rollout statistics (searches per
question, answer rate, invalid actions, truncation, policy tokens), each episode's outcome
(``ragrl.rollout.outcomes``: right, no answer, a reading miss, a search miss, ...) and the mean of
every reward component.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ragrl.config import Method
from ragrl.data.schema import Example
from ragrl.errors import RagrlError
from ragrl.llm.backend import GenerationBackend
from ragrl.llm.environment import environment
from ragrl.metrics.normalize import normalize
from ragrl.metrics.score import Prediction, check_group_key, parse_metrics, score_predictions
from ragrl.retrieval.base import Retriever
from ragrl.rewards import RewardContext
from ragrl.rollout.outcomes import count_outcomes, outcome
from ragrl.rollout.trajectory import Trajectory


@dataclass
class EvalReport:
    scores: dict[str, Any]
    """Aggregate scores (one JSON object)."""
    rows: list[dict[str, Any]]
    """One row per trajectory: id, prediction, every metric, rollout stats and reward components."""
    trajectories: list[Trajectory]
    environment: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The machine, libraries and code the scores came from (``ragrl.llm.environment.environment``, taken
    before the rollout on the backend's device); ``ragrl eval`` writes it as ``environment.json``."""


def _dedupe(ids: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(ids))


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values) if values else 0.0


def repeated_searches(queries: Sequence[str]) -> int:
    """The searches that repeat an earlier query of the same episode, compared SQuAD-normalized (case,
    punctuation and articles aside): a policy stuck asking the same thing, which finds nothing new."""
    seen: set[str] = set()
    repeats = 0
    for query in queries:
        key = normalize(query)
        repeats += key in seen
        seen.add(key)
    return repeats


def rollout_stats(trajectories: Sequence[Trajectory]) -> list[dict[str, Any]]:
    """Per-trajectory rollout statistics."""
    return [
        {
            "searches": t.num_searches,
            "repeated_searches": repeated_searches(t.queries),
            "answered": float(t.final_answer is not None),
            "invalid_actions": t.num_invalid,
            "truncated": float(t.truncated),
            "policy_tokens": t.num_policy_tokens,
            "finish_reason": t.finish_reason,
        }
        for t in trajectories
    ]


def score_trajectories(
    trajectories: Sequence[Trajectory],
    examples: Sequence[Example],
    method: Method,
    *,
    variant: str = "squad",
    ks: Sequence[int] = (2, 5, 10),
    bootstrap: int = 0,
    seed: int = 0,
    by: str | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Scores of trajectories aligned with ``examples`` (one trajectory per example); ``by`` a metadata
    key to score each of its values apart too (``score_predictions``)."""
    by_id = {ex.id: ex for ex in examples}
    predictions = [
        Prediction(t.example_id, t.final_answer or "", retrieved_ids=_dedupe(t.retrieved_ids))
        for t in trajectories
    ]
    result = score_predictions(
        list(examples),
        predictions,
        variant=variant,
        selection=parse_metrics("answer,retrieval", ks),
        bootstrap=bootstrap,
        seed=seed,
        by=by,
    )
    rewards = method.reward.score(trajectories, [by_id[t.example_id] for t in trajectories], RewardContext())
    diagnostics = [method.diagnose(t, by_id[t.example_id]) for t in trajectories]
    stats = rollout_stats(trajectories)
    audit = getattr(method.protocol, "audit", None)  # optional: per-row records (ARENA's citations)
    rows = []
    for t, metrics, st, r, d in zip(
        trajectories, result.per_example, stats, rewards, diagnostics, strict=True
    ):
        rows.append(
            {
                **metrics,
                "prediction": t.final_answer,
                "outcome": outcome(t, by_id[t.example_id], metrics.get("em")),
                **st,
                "queries": t.queries,
                "reward": r.total,
                **{f"reward/{k}": v for k, v in r.components.items()},
                **d,
                **(audit(t) if audit is not None else {}),
            }
        )
    summary = {k: v for k, v in result.summary.items() if k not in ("n_predictions", "unknown_ids")}
    summary["searches_per_question"] = _mean([s["searches"] for s in stats])
    summary["repeated_searches_per_question"] = _mean([s["repeated_searches"] for s in stats])
    summary["answer_rate"] = _mean([s["answered"] for s in stats])
    summary["invalid_actions_per_question"] = _mean([s["invalid_actions"] for s in stats])
    summary["truncation_rate"] = _mean([s["truncated"] for s in stats])
    summary["policy_tokens_mean"] = _mean([s["policy_tokens"] for s in stats])
    summary["reward"] = _mean([r.total for r in rewards])
    for key in method.reward.keys:
        summary[f"reward/{key}"] = _mean([r.components[key] for r in rewards])
    for key in dict.fromkeys(k for d in diagnostics for k in d):
        summary[key] = _mean([d[key] for d in diagnostics if key in d])
    reasons: dict[str, int] = {}
    for s in stats:
        reasons[s["finish_reason"]] = reasons.get(s["finish_reason"], 0) + 1
    summary["finish_reasons"] = dict(sorted(reasons.items()))
    summary["outcomes"] = count_outcomes([row["outcome"] for row in rows])
    return summary, rows


def eval_rollout(
    method: Method, backend: GenerationBackend, retriever: Retriever, *, temperature: float, seed: int
) -> Any:
    """The rollout ``evaluate`` (and ``ragrl ask``) plays: the method's evaluation settings where it has
    them, one episode a question, greedy unless ``temperature`` > 0."""
    base = method.rollout if method.eval_rollout is None else method.eval_rollout
    config = dataclasses.replace(base, temperature=temperature, n=1, seed=seed)
    return method.make_rollout(backend, retriever, config)


def evaluate(
    backend: GenerationBackend,
    retriever: Retriever,
    method: Method,
    examples: Sequence[Example],
    *,
    temperature: float = 0.0,
    seed: int = 0,
    variant: str = "squad",
    bootstrap: int = 0,
    chunk: int = 64,
    on_progress: Callable[[int, int], None] | None = None,
    by: str | None = None,
    done: Sequence[Trajectory] = (),
    on_chunk: Callable[[list[Trajectory]], None] | None = None,
) -> EvalReport:
    """Roll the policy out once per example (greedy unless ``temperature`` > 0) and score it.

    The examples are rolled out ``chunk`` at a time, calling ``on_progress(done, total)`` after each
    chunk. Groups are numbered globally, so every episode keeps its seed whatever ``chunk`` is (a backend
    that pads prompts into batches may still differ in the last float digits between chunkings).
    ``by`` (a metadata key: ``source``, ``type``, ...) scores each of its values apart too (``scores["by"]``);
    it is checked before the rollout.

    ``done`` are the episodes of the first questions from an evaluation that was interrupted
    (``ragrl.eval.progress``): the rollout resumes after them, each later episode with the seed it would
    have had, and ``on_chunk(episodes)`` is called with each chunk's new episodes as it ends."""
    if by is not None:
        by = check_group_key(examples, by)
    rollout = eval_rollout(method, backend, retriever, temperature=temperature, seed=seed)
    examples = list(examples)
    machine = environment(getattr(backend, "device", None))  # before: nothing after it can lose the rollout
    t0 = time.perf_counter()
    trajectories: list[Trajectory] = list(done)
    if [t.example_id for t in trajectories] != [ex.id for ex in examples[: len(trajectories)]]:
        raise RagrlError("the episodes to resume from are not those of the first questions, in their order")
    step = max(chunk, 1)
    for start in range(len(trajectories), len(examples), step):
        part = examples[start : start + step]
        episodes = rollout.run(part, n=1, seed=seed, first_group=start)
        trajectories.extend(episodes)
        if on_chunk is not None:
            on_chunk(episodes)
        if on_progress is not None:
            on_progress(start + len(part), len(examples))
    elapsed = time.perf_counter() - t0
    scores, rows = score_trajectories(
        trajectories, examples, method, variant=variant, bootstrap=bootstrap, seed=seed, by=by
    )
    unk = getattr(backend.tokenizer, "unk_token_id", None)
    if unk is not None:
        prompt_tokens = [t for traj in trajectories for t in traj.prompt_ids]
        scores["prompt_unk_rate"] = sum(t == unk for t in prompt_tokens) / max(len(prompt_tokens), 1)
    scores["method"] = method.name
    scores["temperature"] = temperature
    scores["seed"] = seed
    scores["rollout_seconds"] = round(elapsed, 3)
    scores["questions_cut"] = sum("question_chars" in ex.metadata for ex in examples)
    return EvalReport(scores, rows, trajectories, machine)


NO_ANSWER = "(no answer)"
"""How ``collapse_check`` names trajectories that ended without an answer."""


def collapse_check(rows: list[dict[str, Any]], examples: list[Any]) -> dict[str, Any]:
    """What tells learning from a collapse onto one constant answer: EM on the answerable questions only
    (``Example.answerable``) and the most common prediction with its share of the rows."""
    answerable = {ex.id for ex in examples if ex.answerable}
    ems = [float(r.get("em", 0.0)) for r in rows if r["id"] in answerable]
    predictions = Counter(NO_ANSWER if r.get("prediction") is None else str(r["prediction"]) for r in rows)
    top, count = predictions.most_common(1)[0] if predictions else ("", 0)
    return {
        "eval/em_answerable": round(sum(ems) / len(ems), 6) if ems else 0.0,  # 6: differences stay exact
        "eval/top_answer": top,
        "eval/top_answer_share": round(count / len(rows), 4) if rows else 0.0,
    }
