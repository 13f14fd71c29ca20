"""The entities and relations of the synthetic world, generated from a seed.

Every name is built from random syllables, so it is not a real name and a model cannot know it from
pre-training; a different seed gives different names. Every name *word* is unique in a world (no
surname is also a city), which keeps the questions unambiguous.

Entities live in *pools*. Each split has its own pool (``train``, ``dev``, ``test``: people,
companies, works and the other cities) and a second pool reserved for its unanswerable questions
(``train/unanswerable``, ...). A question of a split only ever reads passages of its own pool (and of
``shared``), so the *facts* a held-out question needs are never needed by a training question. Two
split modes (``SPLIT_MODES``) decide whether the *names* are shared too:

``facts`` (the default)
    Every country and its capital belong to one split's pool as well (``shared`` is empty), and a share
    ``cross_links`` of the answerable pools' relations (born in, works for, headquartered in, founded
    by, created by) point into another split's pool. A training person may be born in a test city:
    the test city's name is then a training answer, while the test city's own facts (its country, its
    population) stay test facts. Held-out questions test reading and composing, not unseen words.
``entities`` (the harder option)
    Relations never leave a pool except towards ``shared`` (the countries and their capitals, the
    background every split may use), so the splits share no person, company, work or city at all.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

from ragrl.errors import RagrlError

SPLITS = ("train", "dev", "test")
SIZES: dict[str, dict[str, int]] = {
    "small": {"train": 400, "dev": 100, "test": 100},
    "medium": {"train": 4000, "dev": 500, "test": 500},
}
COUNTRIES = {"small": 12, "medium": 20}
SHARED_POOL = "shared"
SPLIT_MODES = ("facts", "entities")
DEFAULT_SPLIT_MODE = "facts"
DEFAULT_CROSS_LINKS = 0.5
"""``facts`` mode: the share of the answerable pools' relations that point into another split's pool."""
KINDS = ("country", "city", "person", "company", "work")

CREATIVE = {"book": "novelist", "film": "film director", "album": "musician"}
OTHER_OCCUPATIONS = ("engineer", "chemist", "architect", "economist", "entrepreneur", "physician")
INDUSTRIES = ("software", "shipping", "textile", "mining", "pharmaceutical", "aerospace", "food", "media")
COMPANY_SUFFIXES = ("Labs", "Industries", "Systems", "Works", "Group", "Dynamics", "Motors", "Holdings")
OFFICIAL_FORMS = ("Republic of", "Kingdom of", "Federation of", "Commonwealth of")
TITLE_ADJECTIVES = ("Silent", "Crimson", "Hollow", "Golden", "Distant", "Broken", "Quiet", "Northern")
TITLE_NOUNS = ("River", "Winter", "Garden", "Harbor", "Lantern", "Mirror", "Orchard", "Signal")
GENRES = {
    "book": ("mystery", "historical", "science fiction", "literary", "adventure"),
    "film": ("drama", "comedy", "thriller", "documentary", "war"),
    "album": ("jazz", "folk", "rock", "electronic", "pop"),
}

_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "th", "br", "dr", "kr", "st")
_VOWELS = ("a", "e", "i", "o", "u", "ae", "io")
_CODAS = ("", "", "", "n", "r", "l", "s", "th", "x", "m")


@dataclass(slots=True)
class Entity:
    """One thing in the world. ``facts`` holds scalar facts (years, occupation, ...); ``rels`` maps a
    relation name to the id of another entity."""

    id: str
    kind: str
    name: str
    pool: str
    aliases: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    rels: dict[str, str] = field(default_factory=dict)
    passage_id: str = ""

    @property
    def split(self) -> str | None:
        """The split this entity belongs to (``None`` for the shared background)."""
        return None if self.pool == SHARED_POOL else self.pool.split("/")[0]

    @property
    def reserved(self) -> bool:
        """True for entities kept for unanswerable questions."""
        return self.pool.endswith("/unanswerable")

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "name": self.name,
            "aliases": list(self.aliases),
            "pool": self.pool,
            "facts": dict(self.facts),
            "rels": dict(self.rels),
            "passage_id": self.passage_id,
        }


class NameMaker:
    """Unique, pronounceable, made-up words (each word is used at most once per world)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.used: set[str] = set()

    def word(self, syllables: int) -> str:
        for _ in range(10_000):
            parts = []
            for i in range(syllables):
                coda = self.rng.choice(_CODAS) if i == syllables - 1 or self.rng.random() < 0.3 else ""
                parts.append(self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) + coda)
            w = "".join(parts)
            if len(w) >= 4 and w not in self.used:
                self.used.add(w)
                return w.capitalize()
        raise RuntimeError("name space exhausted")  # pragma: no cover - 10^6 combinations

    def person(self) -> tuple[str, str]:
        return self.word(2), self.word(self.rng.choice((2, 2, 3)))

    def title(self) -> str:
        w = self.word(self.rng.choice((2, 3)))
        form = self.rng.randrange(5)
        if form == 0:
            return f"The {self.rng.choice(TITLE_ADJECTIVES)} {w}"
        if form == 1:
            return f"Echoes of {w}"
        if form == 2:
            return f"{w} {self.rng.choice(TITLE_NOUNS)}"
        if form == 3:
            noun = self.rng.choice(TITLE_NOUNS)
            return f"{'An' if noun[0] in 'AEIOU' else 'A'} {noun} for {w}"
        return w


@dataclass
class Pool:
    """Counts of entities to create in one pool."""

    name: str
    persons: int
    companies: int
    works: int
    cities: int


def pool_sizes(questions: int, reserved: bool) -> tuple[int, int, int, int]:
    """(persons, companies, works, cities) for a pool that will serve ``questions`` questions."""
    if reserved:
        return (
            max(12, math.ceil(1.5 * questions)),
            max(6, math.ceil(0.6 * questions)),
            max(6, math.ceil(0.6 * questions)),
            max(6, math.ceil(0.3 * questions)),
        )
    return (
        max(24, math.ceil(0.7 * questions)),
        max(8, math.ceil(0.25 * questions)),
        max(12, math.ceil(0.35 * questions)),
        max(8, math.ceil(0.08 * questions)),
    )


class EntityStore:
    """All entities of a world, by id and by (pool, kind), in creation order."""

    def __init__(self) -> None:
        self.by_id: dict[str, Entity] = {}
        self._counters: dict[str, int] = {}
        self._index: dict[tuple[str, str], list[Entity]] | None = None

    def add(self, kind: str, name: str, pool: str, aliases: list[str] | None = None, **facts: Any) -> Entity:
        n = self._counters.get(kind, 0)
        self._counters[kind] = n + 1
        ent = Entity(f"{kind}:{n:05d}", kind, name, pool, aliases or [], dict(facts))
        self.by_id[ent.id] = ent
        self._index = None
        return ent

    def move(self, ent: Entity, pool: str) -> None:
        """Put ``ent`` in another pool."""
        ent.pool = pool
        self._index = None

    def of(self, pool: str, kind: str) -> list[Entity]:
        """The entities of one kind in one pool, in creation order (a fresh list)."""
        if self._index is None:
            self._index = {}
            for e in self.by_id.values():
                self._index.setdefault((e.pool, e.kind), []).append(e)
        return list(self._index.get((pool, kind), ()))

    def rel(self, ent: Entity, relation: str) -> Entity:
        return self.by_id[ent.rels[relation]]

    def __iter__(self):
        return iter(self.by_id.values())

    def __len__(self) -> int:
        return len(self.by_id)


def _make_shared(store: EntityStore, names: NameMaker, rng: random.Random, n_countries: int) -> None:
    for _ in range(n_countries):
        stem = names.word(rng.choice((2, 3)))
        name = stem + rng.choice(("ia", "land", "ora", ""))
        official = f"{rng.choice(OFFICIAL_FORMS)} {name}"
        country = store.add("country", name, SHARED_POOL, [name, official], official_name=official)
        capital = store.add(
            "city",
            names.word(2),
            SHARED_POOL,
            population=rng.randrange(300, 4000) * 1000,
            capital=True,
        )
        capital.aliases = [capital.name]
        capital.rels["located_in"] = country.id
        country.rels["capital"] = capital.id


def _populate(store: EntityStore, names: NameMaker, rng: random.Random, pool: Pool) -> None:
    countries = sorted((e for e in store if e.kind == "country"), key=lambda e: e.id)
    order = list(countries)
    rng.shuffle(order)
    # ``facts`` mode: the split's own countries first, so some of its cities lie in a country whose
    # capital is its own fact (no effect in ``entities`` mode, where every country is shared)
    owner = pool.name.split("/")[0]
    order.sort(key=lambda c: c.pool != owner)
    cities = []
    for i in range(pool.cities):
        city = store.add(
            "city", names.word(rng.choice((2, 3))), pool.name, population=rng.randrange(20, 900) * 1000
        )
        city.aliases = [city.name]
        city.rels["located_in"] = order[i % len(order)].id
        cities.append(city)

    persons = []
    kinds = list(CREATIVE)
    for i in range(pool.persons):
        first, last = names.person()
        full = f"{first} {last}"
        # a quarter of the people in each creative occupation, the rest in other jobs
        slot = i % 4
        occupation = CREATIVE[kinds[slot]] if slot < 3 else rng.choice(OTHER_OCCUPATIONS)
        p = store.add(
            "person",
            full,
            pool.name,
            [full, last],
            first_name=first,
            surname=last,
            birth_year=rng.randrange(1900, 1996),
            occupation=occupation,
        )
        p.rels["born_in"] = rng.choice(cities).id
        persons.append(p)

    founders_pool = [p for p in persons if p.facts["occupation"] not in CREATIVE.values()]
    rng.shuffle(founders_pool)
    companies = []
    for i in range(pool.companies):
        stem = names.word(rng.choice((2, 3)))
        name = f"{stem} {rng.choice(COMPANY_SUFFIXES)}"
        founder = founders_pool[i % len(founders_pool)]
        year = min(founder.facts["birth_year"] + rng.randrange(20, 50), 2022)
        c = store.add(
            "company", name, pool.name, [name, stem], founded_year=year, industry=rng.choice(INDUSTRIES)
        )
        c.rels["founded_by"] = founder.id
        c.rels["headquartered_in"] = rng.choice(cities).id
        companies.append(c)
    for p in persons:
        p.rels["works_for"] = rng.choice(companies).id

    creators = {kind: [p for p in persons if p.facts["occupation"] == occ] for kind, occ in CREATIVE.items()}
    for i in range(pool.works):
        kind = kinds[i % 3]
        creator = rng.choice(creators[kind])
        title = names.title()
        year = min(creator.facts["birth_year"] + rng.randrange(20, 50), 2023)
        w = store.add(
            "work",
            title,
            pool.name,
            [title],
            work_kind=kind,
            release_year=year,
            genre=rng.choice(GENRES[kind]),
        )
        w.rels["creator"] = creator.id


def apportion(total: int, weights: list[float]) -> list[int]:
    """Integer counts summing to ``total``, proportional to ``weights`` (largest remainder)."""
    s = sum(weights)
    raw = [total * w / s for w in weights]
    counts = [int(r) for r in raw]
    order = sorted(range(len(raw)), key=lambda i: (-(raw[i] - counts[i]), i))
    for i in order[: total - sum(counts)]:
        counts[i] += 1
    return counts


def _owner_splits(counts: dict[str, tuple[int, int]], n: int) -> list[str]:
    """``n`` split names in proportion to the answerable question counts (largest remainder), in split
    order: which split owns each country in ``facts`` mode."""
    shares = apportion(n, [counts[s][0] for s in SPLITS])
    return [s for s, k in zip(SPLITS, shares, strict=True) for _ in range(k)]


def cross_link(store: EntityStore, rng: random.Random, share: float) -> int:
    """Re-point a share of the answerable pools' relations into another split's pool (``facts`` mode).

    Each relation (born_in, works_for, headquartered_in, founded_by, creator) is redrawn with
    probability ``share`` among the entities of the same kind in the *other* answerable pools that keep
    the world consistent: a non-capital city; a founder with no creative occupation, born 20-50 years
    before the founding; a creator of the right occupation, born 20-50 years before the release. A
    relation with no such candidate stays. Returns the number of relations re-pointed."""

    def others(pool: str, kind: str) -> list[Entity]:
        return [e for p in SPLITS if p != pool for e in store.of(p, kind)]

    # the candidates of each pool's relations, in the other pools: built once per pool
    cities = {p: [c for c in others(p, "city") if not c.facts.get("capital")] for p in SPLITS}
    companies = {p: others(p, "company") for p in SPLITS}
    people = {p: others(p, "person") for p in SPLITS}
    by_occupation = {
        p: {occ: [x for x in people[p] if x.facts["occupation"] == occ] for occ in CREATIVE.values()}
        for p in SPLITS
    }
    founders = {p: [x for x in people[p] if x.facts["occupation"] not in CREATIVE.values()] for p in SPLITS}

    def born(candidates: list[Entity], year: int) -> list[Entity]:
        return [x for x in candidates if 20 <= year - x.facts["birth_year"] <= 50]

    moved = 0
    for e in sorted((e for e in store if e.pool in SPLITS), key=lambda e: e.id):
        p = e.pool
        for rel in sorted(e.rels):
            if rel in ("located_in", "capital") or rng.random() >= share:
                continue
            if rel in ("born_in", "headquartered_in"):
                cands = cities[p]
            elif rel == "works_for":
                cands = companies[p]
            elif rel == "founded_by":
                cands = born(founders[p], e.facts["founded_year"])
            else:  # creator
                cands = born(by_occupation[p][CREATIVE[e.facts["work_kind"]]], e.facts["release_year"])
            if cands:
                e.rels[rel] = cands[rng.randrange(len(cands))].id
                moved += 1
    return moved


def build_entities(
    seed: int,
    size: str,
    counts: dict[str, tuple[int, int]],
    split_mode: str = DEFAULT_SPLIT_MODE,
    cross_links: float = DEFAULT_CROSS_LINKS,
) -> EntityStore:
    """Create every entity of the world. ``counts[split] = (answerable, unanswerable)`` questions;
    ``split_mode`` is one of ``SPLIT_MODES`` (module doc)."""
    if size not in SIZES:
        raise RagrlError(f"unknown synth size {size!r}; choose one of {', '.join(SIZES)}")
    if split_mode not in SPLIT_MODES:
        raise RagrlError(f"unknown split mode {split_mode!r}; choose one of {', '.join(SPLIT_MODES)}")
    if not 0 <= cross_links <= 1:
        raise RagrlError(f"cross_links must be in [0, 1], got {cross_links}")
    rng = random.Random(f"ragrl-synth:{seed}:entities")
    names = NameMaker(random.Random(f"ragrl-synth:{seed}:names"))
    store = EntityStore()
    _make_shared(store, names, rng, COUNTRIES[size])
    if split_mode == "facts":
        # every country (and its capital) is owned by one split: its facts are that split's facts
        countries = sorted((e for e in store if e.kind == "country"), key=lambda e: e.id)
        for country, owner in zip(countries, _owner_splits(counts, len(countries)), strict=True):
            store.move(country, owner)
            store.move(store.rel(country, "capital"), owner)
    for split in SPLITS:
        answerable, unanswerable = counts[split]
        for pool_name, n, reserved in (
            (split, answerable, False),
            (f"{split}/unanswerable", unanswerable, True),
        ):
            persons, companies, works, cities = pool_sizes(n, reserved)
            _populate(store, names, rng, Pool(pool_name, persons, companies, works, cities))
    if split_mode == "facts":
        cross_link(store, random.Random(f"ragrl-synth:{seed}:cross-links"), cross_links)
    return store
