"""``generate_world(seed, size)``: entities -> passages -> questions -> unanswerable rule -> splits.

Everything random comes from ``random.Random`` instances seeded with ``f"ragrl-synth:{seed}:<stage>"``
(string seeds are hashed with SHA-512, so they are stable across runs and platforms), and every set or
dict is sorted before it is sampled from, so the same seed gives byte-identical files.
"""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Any

from ragrl.data.schema import Example, Passage
from ragrl.errors import RagrlError
from ragrl.synth.fairness import world_stats
from ragrl.synth.passages import build_passages
from ragrl.synth.questions import UNANSWERABLE_ANSWER, Draft, draft_questions
from ragrl.synth.synth_world import SynthWorld
from ragrl.synth.world import (
    DEFAULT_CROSS_LINKS,
    DEFAULT_SPLIT_MODE,
    SHARED_POOL,
    SIZES,
    SPLITS,
    Entity,
    EntityStore,
    build_entities,
)

DEFAULT_UNANSWERABLE_FRACTION = 0.1
DEFAULT_GIVEN_PASSAGES = (8, 10)


def _split_counts(size: str, fraction: float) -> dict[str, tuple[int, int]]:
    if size not in SIZES:
        raise RagrlError(f"unknown synth size {size!r}; choose one of {', '.join(SIZES)}")
    if not 0 <= fraction < 1:
        raise RagrlError(f"unanswerable fraction must be in [0, 1), got {fraction}")
    out = {}
    for split, n in SIZES[size].items():
        u = round(n * fraction)
        out[split] = (n - u, u)
    return out


class _Related:
    """Entities linked to an entity: what it points to, what points to it, and its siblings (entities
    pointing to the same target by the same relation: people born in the same city, ...)."""

    def __init__(self, store: EntityStore) -> None:
        self.store = store
        self.incoming: dict[str, list[str]] = defaultdict(list)
        self.by_target: dict[tuple[str, str], list[str]] = defaultdict(list)
        for e in store:
            for rel, t in e.rels.items():
                self.incoming[t].append(e.id)
                self.by_target[(t, rel)].append(e.id)

    def of(self, e: Entity) -> list[str]:
        ids = list(e.rels.values()) + self.incoming[e.id]
        for rel, t in e.rels.items():
            ids += self.by_target[(t, rel)]
        return sorted(set(ids) - {e.id})


def _given_passages(
    rng: random.Random,
    world: EntityStore,
    related: _Related,
    passages: dict[str, Passage],
    d: Draft,
    removed: set[str],
    n_range: tuple[int, int],
) -> list[Passage]:
    """Gold passages (minus removed ones) plus distractors: about half "hard" (entities linked to a
    gold entity or sharing a relation target with it), the rest of the same kinds from the same pool."""
    allowed = {d.pool, SHARED_POOL}
    gold_ids = {e.id for e in d.gold}
    gold = [passages[e.id] for e in d.gold if passages[e.id].id not in removed]
    gold = list({p.id: p for p in gold}.values())
    n_total = rng.randint(*n_range)
    need = max(n_total - len(gold), 0)

    def ok(eid: str) -> bool:
        e = world.by_id[eid]
        return eid not in gold_ids and e.pool in allowed and passages[eid].id not in removed

    hard = sorted({eid for g in d.gold for eid in related.of(g) if ok(eid)})
    rng.shuffle(hard)
    chosen = hard[: (need + 1) // 2]
    kinds = sorted({g.kind for g in d.gold})
    for candidates in ([e.id for k in kinds for e in world.of(d.pool, k)], [e.id for e in world]):
        # random draws with rejection: cheap on large pools, deterministic given the rng
        for _ in range(50 * need):
            if len(chosen) >= need or not candidates:
                break
            eid = candidates[rng.randrange(len(candidates))]
            if ok(eid) and eid not in chosen:
                chosen.append(eid)
    given = gold + [passages[eid] for eid in chosen]
    rng.shuffle(given)
    return given


def generate_world(
    seed: int = 0,
    size: str = "small",
    *,
    split: str = DEFAULT_SPLIT_MODE,
    cross_links: float = DEFAULT_CROSS_LINKS,
    unanswerable_fraction: float = DEFAULT_UNANSWERABLE_FRACTION,
    given_passages: tuple[int, int] = DEFAULT_GIVEN_PASSAGES,
) -> SynthWorld:
    """The synthetic multi-hop world for ``seed``: entities, corpus and train/dev/test questions.
    ``split``: ``facts`` (held-out questions need facts no training question needs; names are shared)
    or ``entities`` (no shared person, company, work or city); see ``ragrl.synth.world``."""
    mode = split  # the name ``split`` is the loop variable below
    counts = _split_counts(size, unanswerable_fraction)
    store = build_entities(seed, size, counts, mode, cross_links)
    passages = build_passages(store, seed)
    rng = random.Random(f"ragrl-synth:{seed}:questions")

    drafts: dict[str, list[tuple[Draft, bool]]] = {}
    for split in SPLITS:
        answerable, unanswerable = counts[split]
        drafts[split] = [(d, True) for d in draft_questions(store, rng, split, answerable)]
        reserved = draft_questions(store, rng, f"{split}/unanswerable", unanswerable, balanced=False)
        drafts[split] += [(d, False) for d in reserved]

    # Unanswerable rule: remove the passage of one (non-shared) hop of each unanswerable chain. Those
    # chains use only their split's reserved entities (and the shared background, never removed), so
    # no answerable question of any split needs a removed passage.
    removed: set[str] = set()
    for split in SPLITS:
        for d, answerable in drafts[split]:
            if not answerable:
                removable = [e for e in d.gold if e.pool == d.pool]  # the reserved pool's own entities
                removed.add(passages[rng.choice(removable).id].id)

    related = _Related(store)
    splits: dict[str, list[Example]] = {}
    for split in SPLITS:
        items = drafts[split]
        rng.shuffle(items)
        examples = []
        for i, (d, answerable) in enumerate(items):
            given = _given_passages(rng, store, related, passages, d, removed, given_passages)
            supporting = [passages[e.id].id for e in d.gold]
            metadata: dict[str, Any] = {
                "source": "synth",
                "type": d.type,
                "hops": len(dict.fromkeys(supporting)),
                "template": d.template,
                "phrasing": d.phrasing,
                "answer_type": d.answer_type,
                "split": split,
                "answerable": answerable,
            }
            answers = list(d.answers)
            if not answerable:
                metadata["removed_passage_ids"] = [pid for pid in supporting if pid in removed]
                metadata["answer_if_answerable"] = answers
                answers = [UNANSWERABLE_ANSWER]
            examples.append(
                Example(
                    id=f"synth{seed}-{split}-{i:05d}",
                    question=d.question,
                    answers=answers,
                    supporting_ids=supporting,
                    passages=given,
                    decomposition=list(d.steps),
                    metadata=metadata,
                )
            )
        splits[split] = examples

    corpus = [p for p in passages.values() if p.id not in removed]
    random.Random(f"ragrl-synth:{seed}:corpus").shuffle(corpus)
    world = SynthWorld(seed, size, store, passages, splits, corpus, sorted(removed), split=mode)
    world.stats = world_stats(world)
    return world
