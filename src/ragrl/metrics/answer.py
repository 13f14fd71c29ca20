"""Answer metrics: exact match, token F1, cover-EM, substring accuracy and answer containment.

Every function takes the prediction, the gold answer(s) (one string or a sequence of aliases; the
score is the maximum over aliases) and ``variant=`` naming the normalization (see
``ragrl.metrics.normalize``). An empty alias list raises ``ValueError``: there is nothing to match.

With a single gold string and ``variant="squad"``, ``exact_match`` and ``f1`` return exactly what the
official HotpotQA script's ``exact_match_score`` and ``f1_score`` return (the same floats, and zeros
in the same cases); ``tests/metrics`` checks this against vectors generated from that script.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

from ragrl.metrics.normalize import get_variant

YES_NO_ANSWERS = ("yes", "no", "noanswer")

Golds = str | Sequence[str]


def _golds(golds: Golds) -> list[str]:
    if isinstance(golds, str):
        return [golds]
    out = list(golds)
    if not out:
        raise ValueError("no gold answers to compare with")
    for g in out:
        if not isinstance(g, str):
            raise TypeError(f"gold answers must be strings, got {type(g).__name__}")
    return out


def exact_match(prediction: str, golds: Golds, variant: str = "squad") -> float:
    """1.0 if the normalized prediction equals some normalized gold answer, else 0.0."""
    norm = get_variant(variant).function
    pred = norm(prediction)
    return 1.0 if any(pred == norm(g) for g in _golds(golds)) else 0.0


def _f1_normalized(pred: str, gold: str, yes_no_rule: bool) -> tuple[float, float, float]:
    if yes_no_rule and pred != gold and (pred in YES_NO_ANSWERS or gold in YES_NO_ANSWERS):
        return (0.0, 0.0, 0.0)
    pred_tokens = pred.split()
    gold_tokens = gold.split()
    num_same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if num_same == 0:
        return (0.0, 0.0, 0.0)
    precision = num_same / len(pred_tokens)
    recall = num_same / len(gold_tokens)
    return (2 * precision * recall) / (precision + recall), precision, recall


def f1(
    prediction: str, golds: Golds, variant: str = "squad", yes_no_rule: bool | None = None
) -> tuple[float, float, float]:
    """Token-level ``(f1, precision, recall)`` on whitespace tokens of the normalized strings.

    Over several aliases, the triple of the alias with the highest F1 is returned (the first such
    alias on ties), so the three numbers always describe one comparison. (FlashRAG instead takes the
    maximum of each component separately; the F1 is the same either way.)

    ``yes_no_rule``: HotpotQA's rule that when either normalized string is ``yes``, ``no`` or
    ``noanswer`` and the two differ, the score is 0. ``None`` uses the variant's default (on for
    ``squad`` and ``tiresrag``, off for ``arena`` and ``none``).
    """
    v = get_variant(variant)
    rule = v.yes_no_rule if yes_no_rule is None else yes_no_rule
    pred = v.function(prediction)
    best: tuple[float, float, float] | None = None
    for g in _golds(golds):
        score = _f1_normalized(pred, v.function(g), rule)
        if best is None or score[0] > best[0]:
            best = score
    assert best is not None
    return best


def cover_em(prediction: str, golds: Golds, variant: str = "squad") -> float:
    """Cover-EM (R1-Searcher, TIRESRAG-R1's reflection reward): 1.0 if every token of some normalized
    gold answer occurs among the normalized prediction's tokens (order and adjacency ignored).

    As in R1-Searcher's ``cover_exact_match_score_1`` (which splits on a single space), a gold answer
    that normalizes to the empty string is covered only by a prediction that is empty too.
    """
    norm = get_variant(variant).function
    pred = norm(prediction)
    pred_tokens = set(pred.split(" "))
    for g in _golds(golds):
        if all(tok in pred_tokens for tok in norm(g).split(" ")):
            return 1.0
    return 0.0


def substring_acc(prediction: str, golds: Golds, variant: str = "squad") -> float:
    """FlashRAG's ``acc`` (a.k.a. sub-EM / "CEM" in TIRESRAG-R1's tables): 1.0 if some normalized gold
    answer is a substring of the normalized prediction (character level, so gold ``no`` is found in
    ``know``). As in FlashRAG, a gold that normalizes to the empty string (e.g. ``"The"``) matches any
    prediction."""
    norm = get_variant(variant).function
    pred = norm(prediction)
    return 1.0 if any(norm(g) in pred for g in _golds(golds)) else 0.0


def contains_answer(text: str, golds: Golds, word_boundary: bool = False, variant: str = "squad") -> bool:
    """Whether some gold answer appears in ``text`` (Eval-RAR's evaluation reward, AutoRefine's refine
    reward): ``normalize(gold) in normalize(text)``.

    The plain character-level test lets the gold ``no`` fire on ``know`` or ``not``. With
    ``word_boundary=True`` the match must not be preceded or followed by a word character (a
    ``\\b``-style test that also works when the gold starts or ends with a non-word character), and a
    gold that normalizes to the empty string never matches.
    """
    norm = get_variant(variant).function
    hay = norm(text)
    for g in _golds(golds):
        needle = norm(g)
        if not word_boundary:
            if needle in hay:
                return True
        elif needle and re.search(r"(?<!\w)" + re.escape(needle) + r"(?!\w)", hay):
            return True
    return False


ANSWER_METRICS = ("em", "f1", "precision", "recall", "cover_em", "acc")
"""Per-example answer metric names produced by ``answer_scores``."""


def answer_scores(prediction: str, golds: Golds, variant: str = "squad") -> dict[str, float]:
    """All answer metrics for one example: ``em``, ``f1``, ``precision``, ``recall``, ``cover_em``,
    ``acc`` (substring accuracy)."""
    f, p, r = f1(prediction, golds, variant)
    return {
        "em": exact_match(prediction, golds, variant),
        "f1": float(f),
        "precision": float(p),
        "recall": float(r),
        "cover_em": cover_em(prediction, golds, variant),
        "acc": substring_acc(prediction, golds, variant),
    }
