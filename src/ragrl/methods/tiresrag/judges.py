"""TIRESRAG-R1's judged rewards: sufficiency R^S (§2.2) and reasoning quality R^T (§2.3).

Both are batched reward components: one call per training step sends every episode's request to the
judge at once (``complete_batch``), behind the reply cache of ``ragrl.metrics.judge_clients``. The
``judge`` setting picks the judge:

* ``{kind: openai, base_url, model, ...}``: any OpenAI-compatible endpoint (the paper serves Qwen3-8B
  with vLLM at temperature 0.6);
* ``{kind: local, path, ...}``: a transformers model on this machine (SmolLM2 from ``make smollm2``);
* ``{kind: proxy}`` (the default): the offline proxy below, for CPU runs without a judge model.

What the judges see (§2.2, §2.3). The episode's response as the code reads it (the protocol's prefill,
then the completion: think text, search tags and the ``<information>`` observations) with every
``<answer>…</answer>`` span removed:

* the sufficiency judge gets the question, the **gold** answer and that context, and must end with the
  JSON ``{"Sufficient Context To The Given Answer": 0 or 1}``. The reply is lowercased and searched for
  that object; no match scores 0.
* the thinking judge gets the retrieved information (the contents of the ``<information>`` blocks,
  stripped, one per line, as the code's ``extract_information_and_others``), the question and the
  thinking process (the policy's text, the prefill first, one turn per line), never the gold answer,
  and must reply with one number from 0.0 to 1.0. A ``<think>…</think>`` block in the reply is
  dropped, and the rest must be a number in [0, 1]; anything else scores 0. (The released code takes
  any ``float()``; a number outside [0, 1] is read as a failure here, so a judge
  cannot push R^T past its stated range.)

Every reply is kept on the trajectory, with whether it parsed: ``metadata["judge"][component] =
{"reply", "parsed"}``. ``judge_parse_failures`` counts them over saved trajectories.

**The offline proxy** (the spec's §7.2 item 3, for CPU runs; not the paper's judge):

* R^S = 1 when every token of some normalized gold answer occurs in the retrieved passages' text
  (the evidence is there), else 0;
* R^T = the mean of two checks that need no gold answer: the episode searched before it answered;
  the final answer's tokens all occur in the retrieved text (the answer is grounded in the evidence,
  not assumed). So R^T ∈ {0, 0.5, 1}. Both read only text and actions, so a trajectory rebuilt from
  saved text (``ragrl reward``) scores as the live one.

The prompts are our own wording of the paper's rubrics (Fig. 11, Fig. 12), with the same sections
and output format. ``system`` and ``template`` replace them from the config.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

from ragrl.data.schema import Example
from ragrl.errors import RagrlError
from ragrl.metrics.answer import cover_em
from ragrl.metrics.judge_clients import JudgeClient, complete_all, make_judge, snippet
from ragrl.rewards.registry import RewardContext, register_reward
from ragrl.rollout.protocol import END_TOKEN_TEXT, find_spans
from ragrl.rollout.trajectory import Trajectory

SUFFICIENCY_SYSTEM = """You are an expert judge of question answering. You receive a QUESTION, its \
ANSWER and some REFERENCES, and you rate one criterion:

Sufficient Context To The Given Answer: 1 if the references hold enough information to infer the \
answer to the question, 0 if they do not. Use only the references, never your own knowledge.

How to decide: list, step by step, the sub-questions that lead from the question to the answer, with \
any assumption or arithmetic they need. Answer each sub-question from the references alone. The \
context is sufficient only if every sub-question can be answered from it.

Example. QUESTION: In which year did the publisher of Roald Dahl's Guide to Railway Safety cease to \
exist? ANSWER: 2001. REFERENCES: the booklet was published in 1991 by the British Railways Board, \
which existed from 1963 to 2001. Sub-questions: who published the booklet (the British Railways \
Board); when did that board cease to exist (2001). Both are answered by the references, so:
{"Sufficient Context To The Given Answer": 1}

Write your reasoning under "### EXPLANATION", then the JSON object under "### EVALUATION (JSON)"."""

SUFFICIENCY_TEMPLATE = "### QUESTION\n{question}\n### ANSWER\n{answer}\n### REFERENCES\n{context}"

THINKING_SYSTEM = """You are an expert rater of the reasoning of retrieval-augmented question \
answering. Rate only the quality of the reasoning, not whether its answer is right, on four criteria:
1. Logical soundness: is the reasoning coherent and well structured?
2. Contextual alignment: does it use the retrieved information correctly?
3. Error awareness: does it avoid assumptions the information does not support?
4. Clarity and precision: is it concise, relevant and free of repetition?
0.0 means completely flawed and 1.0 perfect; values in between such as 0.3 or 0.7 are allowed.
Reply with a single number from 0.0, 0.1, 0.2, ..., 1.0 and nothing else."""

THINKING_TEMPLATE = (
    "INPUT:\n### CONTEXT\n{information}\n### QUESTION\n{question}\n### MODEL THINKING PROCESS\n{thinking}"
)

_SUFFICIENCY_JSON = re.compile(r'\{\s*"sufficient context to the given answer"\s*:\s*([^}]*)\}')
_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL)


# --- what the judges see ------------------------------------------------------------------------------


def response_text(trajectory: Trajectory, prefill: str = "") -> str:
    """The response as the code's reward reads it: the prefill (its chat prompt ends with it, and its
    reward takes the query after ``<|im_start|>assistant``), then the completion, cut at the first end
    token."""
    return END_TOKEN_TEXT.split(prefill + trajectory.completion_text, maxsplit=1)[0]


def without_answers(text: str) -> str:
    """``text`` with every complete ``<answer>…</answer>`` span removed."""
    out, pos = [], 0
    for span in find_spans(text, "answer"):
        out.append(text[pos : span.start])
        pos = span.end
    out.append(text[pos:])
    return "".join(out)


def evidence(trajectory: Trajectory) -> str:
    """The contents of the observations' ``<information>`` blocks, stripped, one per line (a corrective
    message or a reflection cue is not evidence)."""
    return "\n".join(
        span.content.strip()
        for s in trajectory.segments
        if s.kind == "env"
        for span in find_spans(s.text, "information")
    )


def judge_inputs(trajectory: Trajectory, prefill: str = "") -> dict[str, str]:
    """``context`` (``response_text`` without answers), ``information`` (``evidence``) and ``thinking``
    (the policy's turns of that response without answers, the prefill opening the first, one per line;
    blank ones left out)."""
    turns = []
    for segment in trajectory.segments:
        if segment.kind == "policy":
            text, *after_end = END_TOKEN_TEXT.split(segment.text, maxsplit=1)
            turns.append(text)
            if after_end:  # the response ends at an end token
                break
    if turns:
        turns[0] = prefill + turns[0]
    return {
        "context": without_answers(response_text(trajectory, prefill)),
        "information": evidence(trajectory),
        "thinking": "\n".join(t for t in (without_answers(x).strip() for x in turns) if t),
    }


# --- reading the replies ------------------------------------------------------------------------------


def parse_sufficiency(reply: str) -> float | None:
    """1.0 / 0.0 from the reply's ``{"Sufficient Context To The Given Answer": v}``; None if absent."""
    match = _SUFFICIENCY_JSON.search(reply.lower())
    if match is None:
        return None
    try:
        value = json.loads(match.group(1).strip())
    except ValueError:
        return None
    if isinstance(value, bool) or value not in (0, 1):
        return None
    return float(value)


def parse_thinking(reply: str) -> float | None:
    """The reply's number in [0, 1] once a ``<think>…</think>`` block is dropped; None otherwise."""
    try:
        value = float(_THINK_BLOCK.sub("", reply).strip())
    except ValueError:
        return None
    return value if 0.0 <= value <= 1.0 else None


# --- the offline proxy --------------------------------------------------------------------------------


def proxy_sufficiency(trajectory: Trajectory, example: Example) -> float:
    """1 when some gold answer's tokens all occur in the retrieved text, else 0."""
    information = evidence(trajectory)
    return float(bool(information) and cover_em(information, example.answers, "tiresrag") == 1.0)


def proxy_thinking(trajectory: Trajectory) -> float:
    """Mean of: searched before answering; the final answer is grounded in the retrieved text."""
    searched = any(a.kind == "search" for a in trajectory.actions)
    information = evidence(trajectory)
    answer = trajectory.final_answer
    grounded = bool(answer and answer.strip() and information) and (
        cover_em(information, [answer], "tiresrag") == 1.0
    )
    return (float(searched) + float(grounded)) / 2


# --- the components -----------------------------------------------------------------------------------


@lru_cache(maxsize=8)
def _client(spec_json: str) -> JudgeClient:
    return make_judge(json.loads(spec_json))


def _judge_spec(judge: dict[str, Any] | None, component: str) -> dict[str, Any] | None:
    """The client spec, or None for the proxy."""
    spec = dict(judge or {"kind": "proxy"})
    if spec.get("kind") == "proxy":
        if len(spec) > 1:
            raise RagrlError(
                f"{component}.judge: kind proxy takes no settings, got {sorted(set(spec) - {'kind'})}"
            )
        return None
    return spec


def _chat(system: str, user: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def _judged(
    component: str,
    spec: dict[str, Any],
    trajectories: Sequence[Trajectory],
    requests: list[list[dict[str, str]]],
    parse: Callable[[str], float | None],
) -> list[float]:
    """The judge's replies to ``requests`` (one batch), read with ``parse``: an unreadable reply scores
    0. Each reply is kept on its trajectory with whether it parsed."""
    replies = complete_all(_client(json.dumps(spec, sort_keys=True)), requests)
    values = []
    for t, reply in zip(trajectories, replies, strict=True):
        value = parse(reply)
        t.metadata.setdefault("judge", {})[component] = {"reply": snippet(reply), "parsed": value is not None}
        values.append(0.0 if value is None else value)
    return values


@register_reward("tiresrag_sufficiency", batched=True)
def sufficiency_reward(
    trajectories: Sequence[Trajectory],
    examples: Sequence[Example],
    ctx: RewardContext,
    judge: dict[str, Any] | None = None,
    system: str = SUFFICIENCY_SYSTEM,
    template: str = SUFFICIENCY_TEMPLATE,
    prefill: str = "",
) -> list[float]:
    """R^S ∈ {0, 1}: does the episode's evidence suffice to infer the gold answer? ``prefill`` is the
    protocol's (``build_method`` sets it)."""
    spec = _judge_spec(judge, "tiresrag_sufficiency")
    if spec is None:
        return [proxy_sufficiency(t, e) for t, e in zip(trajectories, examples, strict=True)]
    requests = [
        _chat(system, template.format(question=e.question, answer=e.answers[0] if e.answers else "",
                                      context=judge_inputs(t, prefill)["context"]))
        for t, e in zip(trajectories, examples, strict=True)
    ]  # fmt: skip
    return _judged("tiresrag_sufficiency", spec, trajectories, requests, parse_sufficiency)


@register_reward("tiresrag_thinking", batched=True)
def thinking_reward(
    trajectories: Sequence[Trajectory],
    examples: Sequence[Example],
    ctx: RewardContext,
    judge: dict[str, Any] | None = None,
    system: str = THINKING_SYSTEM,
    template: str = THINKING_TEMPLATE,
    prefill: str = "",
) -> list[float]:
    """R^T ∈ [0, 1]: the quality of the episode's reasoning, judged without the gold answer. ``prefill``
    is the protocol's (``build_method`` sets it)."""
    spec = _judge_spec(judge, "tiresrag_thinking")
    if spec is None:
        return [proxy_thinking(t) for t in trajectories]
    seen = [judge_inputs(t, prefill) for t in trajectories]
    requests = [
        _chat(
            system, template.format(information=x["information"], question=e.question, thinking=x["thinking"])
        )
        for x, e in zip(seen, examples, strict=True)
    ]
    return _judged("tiresrag_thinking", spec, trajectories, requests, parse_thinking)


def judge_parse_failures(trajectories: Sequence[Trajectory]) -> dict[str, int]:
    """Replies that did not parse (and so scored 0), per judged component, over ``trajectories``."""
    counts: dict[str, int] = {}
    for t in trajectories:
        for component, record in t.metadata.get("judge", {}).items():
            counts[component] = counts.get(component, 0) + (not record["parsed"])
    return counts
