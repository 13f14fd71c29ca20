"""LLM-as-a-judge: ARENA's LJ metric (arena.md §5.3) and its judge-accuracy reward variant (§2.6).

A judge model gets a system message (``JUDGE_SYSTEM``) and one user message built by ``judge_prompt``
from the gold labels and the *extracted answer* (not the whole response). Its reply is scored by
``parse_judgement``:

* ARENA's evaluation rule (``src/gpt_eval.py``): ``'yes' in reply.lower()`` → 1.0; elif
  ``'no' in reply.lower()`` → 0.0; else 0.5.
* These are **substring** tests, as in the repo: "I don't know" contains ``no`` (in "know") and
  scores 0.0, "Not sure" scores 0.0, "eyes" would score 1.0, and "yes and no" scores 1.0 because
  ``yes`` is tested first. ``strict=True`` tests whole words instead (``\\byes\\b``, ``\\bno\\b``), so
  "I don't know" scores 0.5.
* ``prefix_first=True`` is the reward variant (arena.md §2.6): a reply that *starts* with yes / no
  (after stripping whitespace, case-insensitive) decides first, so "No, yes is wrong" scores 0.0.

``judge_answer`` scores one prediction; an empty (or whitespace-only) prediction scores 0.0 without
calling the judge, as ARENA does. ``judge_answers`` scores many, batching through the client's
``complete_batch`` (the clients live in ``ragrl.metrics.judge_clients``: an OpenAI-compatible
endpoint with concurrent requests, a local transformers model, a persistent cache). The paper's judge
is ``gpt-4o-2024-11-20`` at temperature 0.0.

The banners of ``JUDGE_TEMPLATE`` are our own wording of the paper's Table 8 with the repo's layout:
each banner wrapped in 13 asterisks on each side, blocks separated by ``"\\n\\n\\n\\n"``,
``{correct_answer}`` = ``str(list_of_labels)``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ragrl.errors import RagrlError
from ragrl.metrics.judge_clients import JudgeClient, complete_all, snippet

__all__ = [
    "JUDGE_SYSTEM",
    "JUDGE_TEMPLATE",
    "judge_answer",
    "judge_answers",
    "judge_messages",
    "judge_prompt",
    "parse_judgement",
]

JUDGE_SYSTEM = "You are an intelligent AI assistant."
"""ARENA's system message for the judge (arena.md §5.3)."""

_STARS = "*" * 13
_BLOCK_SEP = "\n\n\n\n"

JUDGE_TEMPLATE = _BLOCK_SEP.join(
    [
        f"{_STARS}This is a knowledge question-answering task with retrieved passages (RAG), used to "
        f"evaluate a model. The list of correct answers is:{_STARS}\n{{correct_answer}}",
        f"{_STARS}The model's answer is:{_STARS}\n{{model_response}}",
        f"{_STARS}Is the model's answer correct? It counts as correct if it matches any item in the "
        f'correct answer list, or a synonym of one. Reply with only "yes" or "no".{_STARS}',
    ]
)
"""The default judge prompt. Placeholders: ``{correct_answer}``, ``{model_response}`` (both required)
and ``{question}`` (optional; ARENA's prompt does not use it)."""

_PLACEHOLDER = re.compile(r"\{(correct_answer|model_response|question)\}")
_REQUIRED = ("{correct_answer}", "{model_response}")
_YES_WORD = re.compile(r"\byes\b")
_NO_WORD = re.compile(r"\bno\b")


def _labels(answers: str | Sequence[str]) -> list[str]:
    labels = [answers] if isinstance(answers, str) else [str(a) for a in answers]
    if not labels:
        raise RagrlError("judge prompt: no gold answers to judge against (answers is empty)")
    return labels


# -- prompt and parsing ----------------------------------------------------------------------------


def judge_prompt(
    answers: str | Sequence[str],
    prediction: str,
    template: str | None = None,
    *,
    question: str = "",
) -> str:
    """The judge's user message: ``template`` (default ``JUDGE_TEMPLATE``) with ``{correct_answer}``
    = ``str(list_of_labels)``, ``{model_response}`` = ``prediction`` (the extracted answer only) and
    ``{question}`` = ``question``.

    Substitution is a single pass over the template, so braces inside the answers or the prediction
    are copied as they are and never substituted again; other braces in the template are literal.
    A template missing ``{correct_answer}`` or ``{model_response}`` is a ``RagrlError``.
    """
    template = JUDGE_TEMPLATE if template is None else template
    missing = [p for p in _REQUIRED if p not in template]
    if missing:
        raise RagrlError(f"judge template: missing placeholder {', '.join(missing)} in {snippet(template)!r}")
    values = {
        "correct_answer": str(_labels(answers)),
        "model_response": prediction,
        "question": question,
    }
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], template)


def judge_messages(
    answers: str | Sequence[str],
    prediction: str,
    template: str | None = None,
    *,
    question: str = "",
    system: str = JUDGE_SYSTEM,
) -> list[dict[str, str]]:
    """``[{"role": "system", ...}, {"role": "user", judge_prompt(...)}]``, what a judge client gets."""
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": judge_prompt(answers, prediction, template, question=question)},
    ]


def parse_judgement(text: str, *, strict: bool = False, prefix_first: bool = False) -> float:
    """Score a judge reply: 1.0 (yes), 0.0 (no) or 0.5 (neither), ARENA's rule (see the module
    docstring for the substring quirk).

    ``strict``: whole-word tests (``\\byes\\b`` / ``\\bno\\b``) instead of substrings.
    ``prefix_first``: the reward variant (arena.md §2.6); a reply starting with ``yes`` / ``no``
    (stripped, case-insensitive) decides before the containment tests.
    """
    lower = text.lower()
    if prefix_first:
        head = lower.strip()
        if head.startswith("yes"):
            return 1.0
        if head.startswith("no"):
            return 0.0
    if strict:
        if _YES_WORD.search(lower):
            return 1.0
        if _NO_WORD.search(lower):
            return 0.0
        return 0.5
    if "yes" in lower:
        return 1.0
    if "no" in lower:
        return 0.0
    return 0.5


# -- scoring ---------------------------------------------------------------------------------------


def judge_answer(
    question: str,
    answers: str | Sequence[str],
    prediction: str,
    *,
    client: JudgeClient,
    cache: dict[str, str] | None = None,
    template: str | None = None,
    strict: bool = False,
    prefix_first: bool = False,
) -> float:
    """The judge's score of ``prediction`` (the extracted answer) against ``answers``: 1.0, 0.5 or 0.0.

    An empty or whitespace-only prediction scores 0.0 and the judge is not called (ARENA: a missing
    ``<answer>`` tag scores 0 on every metric). ``question`` fills ``{question}`` in templates that use
    it (the default does not). ``cache`` maps the user prompt to the judge's raw reply: a prompt seen
    before is not sent again, and the reply is re-parsed with the current ``strict`` / ``prefix_first``.
    Use one cache per judge model. See ``parse_judgement`` for ``strict`` and ``prefix_first``.
    """
    if not prediction.strip():
        return 0.0
    messages = judge_messages(answers, prediction, template, question=question)
    prompt = messages[-1]["content"]
    if cache is not None and prompt in cache:
        reply = cache[prompt]
    else:
        reply = client.complete(messages)
        if cache is not None:
            cache[prompt] = reply
    return parse_judgement(reply, strict=strict, prefix_first=prefix_first)


def judge_answers(
    questions: Sequence[str],
    answers: Sequence[str | Sequence[str]],
    predictions: Sequence[str],
    *,
    client: JudgeClient,
    cache: dict[str, str] | None = None,
    template: str | None = None,
    strict: bool = False,
    prefix_first: bool = False,
) -> list[float]:
    """``judge_answer`` over parallel lists, in order. The prompts not in ``cache`` (and not empty
    predictions) go to the judge once each, in one ``complete_batch`` call when the client has one
    (``LocalJudge``, ``OpenAIJudge``, ``CachedJudge``), else one ``complete`` call each."""
    if not len(questions) == len(answers) == len(predictions):
        raise RagrlError(
            f"judge_answers: questions ({len(questions)}), answers ({len(answers)}) and predictions "
            f"({len(predictions)}) must have the same length"
        )
    prompts: list[str | None] = []
    todo: dict[str, list[dict[str, str]]] = {}
    for question, labels, prediction in zip(questions, answers, predictions, strict=True):
        if not prediction.strip():
            prompts.append(None)
            continue
        messages = judge_messages(labels, prediction, template, question=question)
        prompt = messages[-1]["content"]
        prompts.append(prompt)
        if (cache is None or prompt not in cache) and prompt not in todo:
            todo[prompt] = messages
    fresh = dict(zip(todo, complete_all(client, list(todo.values())) if todo else [], strict=True))
    if cache is not None:
        cache.update(fresh)
    scores = []
    for prompt in prompts:
        if prompt is None:
            scores.append(0.0)
        else:
            reply = fresh[prompt] if prompt in fresh else cache[prompt]  # type: ignore[index]
            scores.append(parse_judgement(reply, strict=strict, prefix_first=prefix_first))
    return scores
