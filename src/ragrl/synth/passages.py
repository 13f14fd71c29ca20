"""One templated passage per entity, stating every fact of that entity.

Each fact is stated in exactly one passage (the passage of the fact's subject): a person's passage
names their birthplace, birth year and employer but not the companies they founded or the works they
made; those live in the company's and the work's passages. So removing one passage really removes a
fact from the corpus (the rule behind unanswerable questions). The only exception is the shared
background: a country's passage names its capital and the capital's passage names its country.

Several sentence templates per kind (chosen at random per entity) vary the wording.
"""

from __future__ import annotations

import random
import re

from ragrl.data.schema import Passage
from ragrl.synth.world import EntityStore

PERSON_TEMPLATES = (
    "{name} (born {year}) is a {occupation} from {city}. {surname} works for {company}.",
    "{name} is a {occupation} who was born in {city} in {year}. {surname} is employed by {company}.",
    "Born in {year} in the city of {city}, {name} became a {occupation}. {surname} currently works at "
    "{company}.",
    "{name} was born in {city} in {year}. A {occupation} by profession, {surname} works for {company}.",
)
COMPANY_TEMPLATES = (
    "{name} is a {industry} company founded in {year} by {founder}. It is headquartered in {city}.",
    "Founded by {founder} in {year}, {name} is a {industry} firm based in {city}.",
    "{name} was established in {year} by {founder}. The {industry} company has its headquarters in {city}.",
)
CITY_TEMPLATES = (
    "{name} is a city in {country} with a population of about {population}.",
    "{name} is located in {country}. About {population} people live there.",
    "With roughly {population} inhabitants, {name} is one of the larger towns of {country}.",
)
CAPITAL_TEMPLATES = (
    "{name} is the capital of {country} and home to about {population} people.",
    "{name}, a city of about {population} inhabitants, is the capital of {country}.",
)
COUNTRY_TEMPLATES = (
    "{name}, officially the {official}, is a country whose capital is {capital}.",
    "The {official}, usually called {name}, is a country. Its capital city is {capital}.",
    "{name} is a country with {capital} as its capital and seat of government.",
)
WORK_TEMPLATES = {
    "book": (
        "{name} is a {genre} novel by {creator}, first published in {year}.",
        "{name} is a {year} {genre} novel written by {creator}.",
        "Written by {creator}, the {genre} novel {name} was published in {year}.",
    ),
    "film": (
        "{name} is a {year} {genre} film directed by {creator}.",
        "Directed by {creator}, {name} is a {genre} film released in {year}.",
        "{name} is a {genre} film by director {creator}; it premiered in {year}.",
    ),
    "album": (
        "{name} is a {genre} album by the musician {creator}, released in {year}.",
        "{name} is a {year} {genre} album recorded by {creator}.",
        "Recorded by {creator}, the {genre} album {name} came out in {year}.",
    ),
}


def _population(n: int) -> str:
    return f"{n:,}"


_ARTICLE = re.compile(r"\b([Aa]) (?=[AEIOUaeiou])")


def fix_articles(text: str) -> str:
    """``a`` -> ``an`` before a vowel ("an architect", "an aerospace company")."""
    return _ARTICLE.sub(lambda m: m.group(1) + "n ", text)


def build_passages(store: EntityStore, seed: int) -> dict[str, Passage]:
    """The passage of every entity, by entity id; also sets ``entity.passage_id``."""
    rng = random.Random(f"ragrl-synth:{seed}:passages")
    out: dict[str, Passage] = {}
    for e in store:
        f = e.facts
        if e.kind == "person":
            text = rng.choice(PERSON_TEMPLATES).format(
                name=e.name,
                surname=f["surname"],
                year=f["birth_year"],
                occupation=f["occupation"],
                city=store.rel(e, "born_in").name,
                company=store.rel(e, "works_for").name,
            )
        elif e.kind == "company":
            text = rng.choice(COMPANY_TEMPLATES).format(
                name=e.name,
                industry=f["industry"],
                year=f["founded_year"],
                founder=store.rel(e, "founded_by").name,
                city=store.rel(e, "headquartered_in").name,
            )
        elif e.kind == "city":
            templates = CAPITAL_TEMPLATES if f.get("capital") else CITY_TEMPLATES
            text = rng.choice(templates).format(
                name=e.name, country=store.rel(e, "located_in").name, population=_population(f["population"])
            )
        elif e.kind == "country":
            text = rng.choice(COUNTRY_TEMPLATES).format(
                name=e.name, official=f["official_name"], capital=store.rel(e, "capital").name
            )
        elif e.kind == "work":
            text = rng.choice(WORK_TEMPLATES[f["work_kind"]]).format(
                name=e.name, genre=f["genre"], year=f["release_year"], creator=store.rel(e, "creator").name
            )
        else:  # pragma: no cover - the world only makes the kinds above
            raise ValueError(e.kind)
        passage = Passage.make(e.name, fix_articles(text))
        e.passage_id = passage.id
        out[e.id] = passage
    return out
