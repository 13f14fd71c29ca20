"""Answer normalization, as a registry of named variants.

Papers that all say "normalized exact match" use different normalizations, and the difference moves
scores: SQuAD deletes punctuation (``U.S.`` → ``us``) while ARENA and TIRESRAG-R1 replace it with a
space (``U.S.`` → ``u s``). Every metric in ``ragrl.metrics`` takes ``variant=`` naming one of these.

=================  ========================================================================================
``squad``          lower → delete ``string.punctuation`` → ``\\b(a|an|the)\\b`` → space → collapse whitespace.
                   The official SQuAD v1.1 / HotpotQA scorer; also MuSiQue, FlashRAG, Search-R1 ``qa_em``,
                   Eval-RAR / AutoRefine, EVO-RAG. Aliases ``hotpotqa``, ``flashrag``.
``arena``          ``_`` → space → lower → each char of ``string.punctuation`` and ``‘ ’ ´ ` `` → space →
                   articles → space → collapse whitespace. ARENA's reward and evaluation code.
``tiresrag``       the whole string ``"True"`` → ``"yes"``, ``"False"`` → ``"no"`` (exact, case-sensitive,
                   before anything else), then ``_`` → space → lower → each char of ``string.punctuation``
                   and ``´`` → space → articles → space → collapse whitespace: ``arena`` without the curly
                   quotes ``‘ ’``, which stay (the authors' ``normalize_answer`` lists ``' ' ´ ` `` and
                   both quotes there are the straight one). TIRESRAG-R1's answer reward.
``r1_searcher``    the same ``True``/``False`` mapping, then ``arena`` (the curly quotes go):
                   R1-Searcher's ``normalize_answer``, which TIRESRAG-R1's OpenRLHF fork also keeps in
                   ``cli/server_rm_rag.py``.
``none``           strip and collapse whitespace only (case and punctuation kept): exact comparison.
                   Alias ``exact``.
=================  ========================================================================================

"Collapse whitespace" is ``" ".join(text.split())``: Python's ``str.split()`` splits on every Unicode
whitespace character (no-break space, em space, line separator, ...), exactly as the reference
scripts do. Only ASCII punctuation is removed; ``—``, ``’`` (except in ``arena`` and ``r1_searcher``)
and full-width punctuation stay, as in the reference scripts.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable
from dataclasses import dataclass

from ragrl.errors import RagrlError

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_DELETE_PUNCT = str.maketrans("", "", string.punctuation)
_ARENA_PUNCT = string.punctuation + "\u2018\u2019\u00b4`"
_SPACE_PUNCT = str.maketrans({ch: " " for ch in _ARENA_PUNCT})
_TIRESRAG_PUNCT = str.maketrans({ch: " " for ch in string.punctuation + "\u00b4"})


def _collapse(text: str) -> str:
    return " ".join(text.split())


def normalize_squad(text: str) -> str:
    """SQuAD v1.1 / HotpotQA normalization: lower, delete ASCII punctuation, drop articles, collapse."""
    text = text.lower().translate(_DELETE_PUNCT)
    return _collapse(_ARTICLES.sub(" ", text))


def normalize_arena(text: str) -> str:
    """ARENA normalization: ``_`` → space, lower, punctuation (plus ‘ ’ ´ `) → space, drop articles,
    collapse."""
    text = text.replace("_", " ").lower().translate(_SPACE_PUNCT)
    return _collapse(_ARTICLES.sub(" ", text))


def bool_to_yes_no(text: str) -> str:
    """TIRESRAG-R1 / R1-Searcher's mapping: exactly ``"True"`` → ``"yes"``, ``"False"`` → ``"no"``.

    Whole-string and case-sensitive, applied to the raw string (``" True"`` and ``"true"`` are left
    alone; ``"true"`` needs no mapping to compare equal to another ``"true"`` anyway).
    """
    if text == "True":
        return "yes"
    if text == "False":
        return "no"
    return text


def normalize_tiresrag(text: str) -> str:
    """TIRESRAG-R1 / R1-Searcher normalization (the authors' ``normalize_answer`` after
    ``bool_mapping``): ``bool_to_yes_no``, ``_`` → space, lower, ASCII punctuation and ``´`` → space,
    drop articles, collapse. Unlike ``arena`` the curly quotes ``‘ ’`` stay: ``"Levertov’s"`` is one
    token."""
    text = bool_to_yes_no(text).replace("_", " ").lower().translate(_TIRESRAG_PUNCT)
    return _collapse(_ARTICLES.sub(" ", text))


def normalize_r1_searcher(text: str) -> str:
    """R1-Searcher normalization: ``bool_to_yes_no`` then ``normalize_arena`` (the curly quotes go)."""
    return normalize_arena(bool_to_yes_no(text))


def normalize_none(text: str) -> str:
    """No normalization beyond stripping and collapsing whitespace."""
    return _collapse(text)


@dataclass(frozen=True)
class Variant:
    """A named normalization and the defaults that go with it."""

    name: str
    function: Callable[[str], str]
    steps: str
    used_by: str
    yes_no_rule: bool
    """Whether F1 applies HotpotQA's yes/no/noanswer rule by default under this variant."""
    aliases: tuple[str, ...] = ()


_VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant(
            "squad",
            normalize_squad,
            "lower; delete string.punctuation; \\b(a|an|the)\\b -> space; collapse whitespace",
            "official SQuAD v1.1 and HotpotQA scorers, MuSiQue, FlashRAG, Search-R1 qa_em, "
            "Eval-RAR / AutoRefine, EVO-RAG",
            yes_no_rule=True,
            aliases=("hotpotqa", "flashrag"),
        ),
        Variant(
            "arena",
            normalize_arena,
            "_ -> space; lower; string.punctuation and ‘ ’ ´ ` -> space; "
            "\\b(a|an|the)\\b -> space; collapse whitespace",
            "ARENA (reward and EM/F1 evaluation; F1 without the yes/no rule)",
            yes_no_rule=False,
        ),
        Variant(
            "tiresrag",
            normalize_tiresrag,
            "whole string 'True' -> 'yes', 'False' -> 'no'; _ -> space; lower; "
            "string.punctuation and ´ -> space (‘ ’ stay); \\b(a|an|the)\\b -> space; collapse whitespace",
            "TIRESRAG-R1 answer reward (reward/answer_reflection_reward.py: EM, cover-EM, F1)",
            yes_no_rule=True,
        ),
        Variant(
            "r1_searcher",
            normalize_r1_searcher,
            "whole string 'True' -> 'yes', 'False' -> 'no'; then arena",
            "R1-Searcher (metric_calc_rule: EM, cover-EM, F1; OpenRLHF-RAG cli/server_rm_rag.py)",
            yes_no_rule=True,
        ),
        Variant(
            "none",
            normalize_none,
            "strip; collapse whitespace (case and punctuation kept)",
            "exact comparison, for sanity checks and case-sensitive answers",
            yes_no_rule=False,
            aliases=("exact",),
        ),
    )
}
_ALIASES: dict[str, str] = {a: v.name for v in _VARIANTS.values() for a in v.aliases}

VARIANTS: dict[str, str] = {name: f"{v.steps}. Used by: {v.used_by}." for name, v in _VARIANTS.items()}
"""Variant name → what it does and who uses it (canonical names only; see ``variant_names``)."""


def variant_names(include_aliases: bool = True) -> list[str]:
    names = list(_VARIANTS)
    if include_aliases:
        names += sorted(_ALIASES)
    return names


def get_variant(name: str) -> Variant:
    """The ``Variant`` called ``name`` (or one of its aliases); ``RagrlError`` lists the valid names."""
    key = name.strip().lower() if isinstance(name, str) else name
    key = _ALIASES.get(key, key)
    try:
        return _VARIANTS[key]
    except (KeyError, TypeError):
        valid = (
            ", ".join(_VARIANTS)
            + " (aliases: "
            + ", ".join(f"{a}={c}" for a, c in sorted(_ALIASES.items()))
            + ")"
        )
        raise RagrlError(f"unknown normalization variant {name!r}; valid: {valid}") from None


def get_normalizer(name: str) -> Callable[[str], str]:
    """The normalization function of variant ``name``."""
    return get_variant(name).function


def normalize(text: str, variant: str = "squad") -> str:
    """Normalize ``text`` with the named variant (default: the official SQuAD/HotpotQA one)."""
    return get_variant(variant).function(text)
