"""Question templates (bridge and comparison) and how questions are drawn from the world.

A *bridge* template follows a chain of relations from a subject entity (``company -founded_by->
person -born_in-> city``); each hop is answered by the passage of the entity at that hop, so the gold
passages come in hop order and every decomposition step is a self-contained question about a named
entity ("Who founded Zorvex Labs?" -> "Mira Tolan"; "Where was Mira Tolan born?" -> "Tamrin").

A *comparison* template compares one year-valued fact of two entities of the same kind: yes/no
("Was A born before B?") or pick-one ("Which company was founded earlier, X or Y?"). Yes/no answers
are balanced 50/50 per template and split, and the correct option of a pick-one question is first in
half of them, so neither a constant answer nor a position rule does better than chance.

Templates live in ``templates.py``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from ragrl.data.schema import SubQuestion
from ragrl.synth.templates import (
    BRIDGE_TEMPLATES,
    COMPARISON_TEMPLATES,
    CREATOR_QUESTIONS,
    CREATOR_ROLE,
    FAMILY_SHARE,
    SCALAR_FACTS,
    SUB_QUESTIONS,
    UNANSWERABLE_ANSWER,
    WORK_NOUN,
    BridgeTemplate,
    ComparisonTemplate,
    template_weights,
)
from ragrl.synth.world import SHARED_POOL, Entity, EntityStore, apportion


@dataclass
class Draft:
    """A question before ids, given passages and the unanswerable rule are applied."""

    template: str
    type: str
    question: str
    answers: list[str]
    answer_type: str
    steps: list[SubQuestion]
    gold: list[Entity]  # the entity whose passage answers each hop, in hop order
    pool: str
    phrasing: int
    extra: dict = field(default_factory=dict)


def _role(ent: Entity) -> str:
    return CREATOR_ROLE.get(ent.facts.get("work_kind", ""), "")


def _sub_question(ent: Entity, relation: str) -> str:
    if relation == "creator":
        return CREATOR_QUESTIONS[ent.facts["work_kind"]].format(x=ent.name)
    return SUB_QUESTIONS[relation].format(x=ent.name)


def follow_chain(store: EntityStore, subject: Entity, chain: tuple[str, ...]):
    """``(entities along the chain, final value)``; the final value is an Entity or a year (int)."""
    ents, cur = [subject], subject
    for rel in chain:
        if rel in SCALAR_FACTS:
            return ents, cur.facts[rel]
        cur = store.rel(cur, rel)
        ents.append(cur)
    return ents[:-1], ents[-1]


def _answers(value) -> list[str]:
    return [str(value)] if isinstance(value, int) else list(value.aliases)


def _bridge_valid(store: EntityStore, subject: Entity, t: BridgeTemplate, pool: str) -> bool:
    """A chain of distinct entities whose every hop reads a passage of ``pool`` (or of the shared
    background): a question never needs a fact that belongs to another split. (The final value may be
    anywhere: its own passage is not read.)"""
    ents, value = follow_chain(store, subject, t.chain)
    everything = ents + ([value] if isinstance(value, Entity) else [])
    own = all(e.pool in (pool, pool.split("/")[0], SHARED_POOL) for e in ents)
    return own and len({e.id for e in everything}) == len(everything)


def draft_bridge(
    store: EntityStore, rng: random.Random, t: BridgeTemplate, subject: Entity, pool: str
) -> Draft:
    ents, value = follow_chain(store, subject, t.chain)
    k = rng.randrange(len(t.phrasings))
    question = t.phrasings[k].format(x=subject.name, role=_role(subject))
    steps = []
    for i, rel in enumerate(t.chain):
        nxt = value if i == len(t.chain) - 1 else ents[i + 1]
        steps.append(SubQuestion(_sub_question(ents[i], rel), tuple(_answers(nxt)), (ents[i].passage_id,)))
    return Draft(t.name, "bridge", question, _answers(value), t.answer_type, steps, ents, pool, k)


def draft_comparison(
    rng: random.Random, t: ComparisonTemplate, a: Entity, b: Entity, pool: str, target: int
) -> Draft:
    """``target``: for yes/no 1 = "yes", 0 = "no"; for pick-one the position (0 or 1) of the answer."""
    k = rng.randrange(len(t.phrasings))
    fmt, mode = t.phrasings[k]
    ya, yb = a.facts[t.fact], b.facts[t.fact]
    if t.yes_no:
        yes = ya < yb if mode == "lt" else ya > yb
        if int(yes) != target:
            a, b = b, a
        answer = "yes" if target else "no"
        answers = [answer]
    else:
        first_wins = (ya < yb) == (mode == "min")
        if int(not first_wins) != target:
            a, b = b, a
        answers = list((a, b)[target].aliases)
    noun = WORK_NOUN.get(a.facts.get("work_kind", ""), "")
    question = fmt.format(a=a.name, b=b.name, noun=noun)
    sub = SUB_QUESTIONS[t.fact]
    steps = [SubQuestion(sub.format(x=e.name), (str(e.facts[t.fact]),), (e.passage_id,)) for e in (a, b)]
    answer_type = "yes/no" if t.yes_no else t.kind
    return Draft(t.name, "comparison", question, answers, answer_type, steps, [a, b], pool, k)


def draft_questions(
    store: EntityStore, rng: random.Random, pool: str, total: int, balanced: bool = True
) -> list[Draft]:
    """``total`` drafts over all templates from the entities of ``pool`` (weights: ``FAMILY_SHARE``).
    A bridge chain only reads passages of ``pool``, of the split that owns it, or of ``shared``."""
    weighted = template_weights()
    subjects = {
        t.name: [e for e in store.of(pool, t.start) if _bridge_valid(store, e, t, pool)]
        for t, _ in weighted
        if isinstance(t, BridgeTemplate)
    }
    # a template with no valid chain in this pool (possible in ``facts`` mode on a small world) gives
    # its share to the others
    weights = [0.0 if subjects.get(t.name) == [] else w for t, w in weighted]
    counts = apportion(total, weights)
    drafts: list[Draft] = []
    for (t, _), n in zip(weighted, counts, strict=True):
        if n == 0:
            continue
        if isinstance(t, BridgeTemplate):
            cands = subjects[t.name]
            rng.shuffle(cands)
            drafts += [draft_bridge(store, rng, t, cands[i % len(cands)], pool) for i in range(n)]
        else:
            drafts += _draft_comparisons(store, rng, t, pool, n, balanced)
    return drafts


def _draft_comparisons(
    store: EntityStore, rng: random.Random, t: ComparisonTemplate, pool: str, n: int, balanced: bool
) -> list[Draft]:
    ents = store.of(pool, t.kind)
    same_group: Callable[[Entity], str] = lambda e: e.facts.get("work_kind", "")  # noqa: E731
    targets = [i % 2 for i in range(n)] if balanced else [rng.randrange(2) for _ in range(n)]
    rng.shuffle(targets)
    seen: set[tuple[str, str]] = set()
    out = []
    for target in targets:
        for _attempt in range(200):
            a, b = rng.sample(ents, 2)
            key = tuple(sorted((a.id, b.id)))
            if same_group(a) != same_group(b) or a.facts[t.fact] == b.facts[t.fact]:
                continue
            if key in seen and _attempt < 100:
                continue
            break
        if same_group(a) != same_group(b) or a.facts[t.fact] == b.facts[t.fact]:
            raise RuntimeError(f"pool {pool!r} has no valid pair for {t.name}")  # pragma: no cover
        seen.add(key)
        out.append(draft_comparison(rng, t, a, b, pool, target))
    return out


__all__ = [
    "BRIDGE_TEMPLATES",
    "COMPARISON_TEMPLATES",
    "FAMILY_SHARE",
    "UNANSWERABLE_ANSWER",
    "apportion",
    "draft_questions",
]
