"""TIRESRAG-R1's rule-based rewards: the answer reward R^A and the reflection reward R^R. The judged
rewards R^S and R^T are in ``ragrl.methods.tiresrag.judges``.

**Answer reward R^A (§2.1).** Token F1 of the last ``<answer>`` against the gold answers, with the
method's normalization (``tiresrag``: the authors' ``normalize_answer``, ``True``/``False`` →
``yes``/``no``, punctuation to spaces, the curly quotes kept) and the yes/no rule (two different strings,
either one ``yes``, ``no`` or ``noanswer``, score 0). An empty ``<answer> </answer>`` is the answer
``""`` (``protocol.empty_answer``), F1 0. An episode without an answer (§8 Q16): ``no_answer: text``
scores what the code's ``extract_answer_math`` reads from the response (the prefill, then the
completion, cut at an end token): the text after its last ``<answer>``, or all of it; ``zero`` (the
default) scores 0, since the code's way can reward a reply that never answers. A saved completion with
more answers than a live rollout gives (``ragrl reward``) is read to its end: the last answer is scored.

**Reflection reward R^R (§2.4)**, compared between the first and the last answer, ``mode``:

* ``paper`` (Eq. 4, the default): +1 if the first answer is wrong and the last right, −1 the other way,
  else 0 (one answer or none: 0). "Right" is cover-EM: every gold token occurs in the answer.
* ``code`` (``answer_reflection_reward.py``): "right" is ``F1 > 0.5`` or cover-EM; one answer scores 0
  if right and −1 if wrong; several score −1 if the last is wrong, or if both are right and the last
  has the lower F1, else 0. It never gives +1.
"""

from __future__ import annotations

from ragrl.data.schema import Example
from ragrl.errors import RagrlError
from ragrl.methods.tiresrag.judges import response_text
from ragrl.methods.tiresrag.protocol import NO_ANSWER_MODES, REFLECTION_MODES, VARIANT
from ragrl.metrics.answer import cover_em, f1
from ragrl.rewards.registry import RewardContext, register_reward
from ragrl.rollout.trajectory import Trajectory

# -- R^A: the answer reward (§2.1) ---------------------------------------------------------------------------


def answer_f1(prediction: str, golds: list[str]) -> float:
    """Token F1 with the method's normalization and the yes/no rule, maximised over the gold answers."""
    return float(f1(prediction, golds, variant=VARIANT)[0])


def answer_right(answer: str | None, golds: list[str]) -> bool:
    """Cover-EM with the method's normalization: every token of some gold answer is in the answer (the
    "right" of the paper's R^R, the reflection transitions, the 2×2 and the §4 analysis)."""
    return answer is not None and cover_em(answer, golds, VARIANT) == 1.0


def code_prediction(response: str) -> str:
    """The code's ``extract_answer_math``: the text after the last ``<answer>`` up to its
    ``</answer>``, stripped; the whole response when it has no ``<answer>``."""
    return response.split("<answer>")[-1].split("</answer>")[0].strip()


@register_reward("tiresrag_answer")
def answer_reward(
    trajectory: Trajectory, example: Example, ctx: RewardContext, no_answer: str = "zero", prefill: str = ""
) -> float:
    """R^A: F1 of the last ``<answer>``; without one, 0 (``zero``) or the F1 of what the released code
    extracts from the response, the prefill included (``text``; ``code_prediction``). ``prefill`` is the
    protocol's (``build_method`` sets it)."""
    if no_answer not in NO_ANSWER_MODES:
        raise RagrlError(f"tiresrag_answer.no_answer must be one of {NO_ANSWER_MODES}, got {no_answer!r}")
    if trajectory.final_answer is not None:
        return answer_f1(trajectory.final_answer, example.answers)
    if no_answer == "zero":
        return 0.0
    return answer_f1(code_prediction(response_text(trajectory, prefill)), example.answers)


# -- R^R: the reflection reward (§2.4) -----------------------------------------------------------------------


def reflection_value(answers: list[str], golds: list[str], mode: str = "paper") -> float:
    """R^R of an episode whose ``<answer>`` bodies are ``answers``, in writing order."""
    if mode not in REFLECTION_MODES:
        raise RagrlError(f"tiresrag_reflection.mode must be one of {REFLECTION_MODES}, got {mode!r}")
    if not answers:
        return 0.0
    first, last = answers[0], answers[-1]
    if mode == "paper":
        if len(answers) < 2:
            return 0.0
        return float(answer_right(last, golds)) - float(answer_right(first, golds))  # +1, −1 or 0

    def ok(answer: str) -> bool:
        return answer_f1(answer, golds) > 0.5 or answer_right(answer, golds)

    if len(answers) == 1:
        return 0.0 if ok(first) else -1.0
    if not ok(last):
        return -1.0
    if ok(first) and answer_f1(last, golds) < answer_f1(first, golds):
        return -1.0
    return 0.0


@register_reward("tiresrag_reflection")
def reflection_reward(
    trajectory: Trajectory, example: Example, ctx: RewardContext, mode: str = "paper"
) -> float:
    """R^R: did the reflection pass fix a wrong answer (+1) or break a right one (−1)?"""
    return reflection_value(trajectory.answers, example.answers, mode)
