"""The question templates: sub-question wordings, bridge chains, comparisons and their phrasings.

A bridge template is a chain of relations followed from a subject entity plus several phrasings of the
composed question; a comparison template names the year-valued fact it compares and phrasings with a
mode (``lt``/``gt`` for yes/no, ``min``/``max`` for pick-one). ``FAMILY_SHARE`` sets the mix.
"""

from __future__ import annotations

from dataclasses import dataclass

UNANSWERABLE_ANSWER = "unknown"
"""The gold answer of every unanswerable question (its evidence was removed from the corpus)."""

CREATOR_ROLE = {"book": "author", "film": "director", "album": "artist"}
WORK_NOUN = {"book": "novel", "film": "film", "album": "album"}
CREATOR_QUESTIONS = {
    "book": "Who wrote {x}?",
    "film": "Who directed {x}?",
    "album": "Who recorded the album {x}?",
}
SUB_QUESTIONS = {
    "founded_by": "Who founded {x}?",
    "born_in": "Where was {x} born?",
    "birth_year": "When was {x} born?",
    "works_for": "Which company does {x} work for?",
    "headquartered_in": "Where is {x} headquartered?",
    "located_in": "In which country is {x} located?",
    "capital": "What is the capital of {x}?",
    "founded_year": "When was {x} founded?",
    "release_year": "When was {x} released?",
}
SCALAR_FACTS = {"birth_year", "founded_year", "release_year"}


@dataclass(frozen=True)
class BridgeTemplate:
    name: str
    start: str  # kind of the subject entity
    chain: tuple[str, ...]  # relations followed from the subject
    answer_type: str
    phrasings: tuple[str, ...]  # format strings with {x} (subject) and {role} (for works)

    @property
    def hops(self) -> int:
        return len(self.chain)


@dataclass(frozen=True)
class ComparisonTemplate:
    name: str
    kind: str
    fact: str
    yes_no: bool
    # (format string with {a}, {b} and {noun}, mode): yes/no modes "lt"/"gt" (yes iff year_a < / > year_b);
    # pick modes "min"/"max" (the answer is the entity with the smaller / larger year)
    phrasings: tuple[tuple[str, str], ...]
    hops: int = 2


B = BridgeTemplate
BRIDGE_TEMPLATES = (
    B(
        "founder_birthplace",
        "company",
        ("founded_by", "born_in"),
        "city",
        (
            "Where was the founder of {x} born?",
            "In which city was the person who founded {x} born?",
            "What is the birthplace of the founder of {x}?",
        ),
    ),
    B(
        "founder_birthyear",
        "company",
        ("founded_by", "birth_year"),
        "year",
        (
            "In what year was the founder of {x} born?",
            "When was the person who founded {x} born?",
        ),
    ),
    B(
        "creator_employer",
        "work",
        ("creator", "works_for"),
        "company",
        (
            "Which company does the {role} of {x} work for?",
            "For which company does the {role} of {x} work?",
            "Who employs the {role} of {x}?",
        ),
    ),
    B(
        "creator_birthplace",
        "work",
        ("creator", "born_in"),
        "city",
        (
            "Where was the {role} of {x} born?",
            "What is the birthplace of the {role} of {x}?",
        ),
    ),
    B(
        "creator_birthyear",
        "work",
        ("creator", "birth_year"),
        "year",
        (
            "In which year was the {role} of {x} born?",
            "When was the {role} of {x} born?",
        ),
    ),
    B(
        "employer_hq",
        "person",
        ("works_for", "headquartered_in"),
        "city",
        (
            "In which city is the company that {x} works for headquartered?",
            "Where is the employer of {x} headquartered?",
        ),
    ),
    B(
        "employer_founder",
        "person",
        ("works_for", "founded_by"),
        "person",
        (
            "Who founded the company that {x} works for?",
            "Who is the founder of the company employing {x}?",
        ),
    ),
    B(
        "employer_founded_year",
        "person",
        ("works_for", "founded_year"),
        "year",
        (
            "In what year was the company that {x} works for founded?",
            "When was the employer of {x} founded?",
        ),
    ),
    B(
        "birth_country",
        "person",
        ("born_in", "located_in"),
        "country",
        (
            "In which country was {x} born?",
            "{x} was born in which country?",
        ),
    ),
    B(
        "hq_country",
        "company",
        ("headquartered_in", "located_in"),
        "country",
        (
            "In which country is {x} headquartered?",
            "In what country are the headquarters of {x}?",
        ),
    ),
    B(
        "founder_birth_country",
        "company",
        ("founded_by", "born_in", "located_in"),
        "country",
        (
            "In which country was the founder of {x} born?",
            "The founder of {x} was born in which country?",
        ),
    ),
    B(
        "creator_employer_hq",
        "work",
        ("creator", "works_for", "headquartered_in"),
        "city",
        (
            "In which city is the employer of the {role} of {x} headquartered?",
            "Where is the company that employs the {role} of {x} headquartered?",
        ),
    ),
    B(
        "creator_employer_founder",
        "work",
        ("creator", "works_for", "founded_by"),
        "person",
        (
            "Who founded the company that employs the {role} of {x}?",
            "Who is the founder of the company the {role} of {x} works for?",
        ),
    ),
    B(
        "creator_birth_country",
        "work",
        ("creator", "born_in", "located_in"),
        "country",
        (
            "In which country was the {role} of {x} born?",
            "The {role} of {x} was born in which country?",
        ),
    ),
    B(
        "birth_country_capital",
        "person",
        ("born_in", "located_in", "capital"),
        "city",
        (
            "What is the capital of the country where {x} was born?",
            "Which city is the capital of the country in which {x} was born?",
        ),
    ),
    B(
        "employer_hq_country",
        "person",
        ("works_for", "headquartered_in", "located_in"),
        "country",
        (
            "In which country is the company that {x} works for headquartered?",
            "The employer of {x} is headquartered in which country?",
        ),
    ),
)

C = ComparisonTemplate
COMPARISON_TEMPLATES = (
    C(
        "birth_order_yesno",
        "person",
        "birth_year",
        True,
        (
            ("Was {a} born before {b}?", "lt"),
            ("Was {a} born earlier than {b}?", "lt"),
            ("Is {a} older than {b}?", "lt"),
            ("Was {a} born after {b}?", "gt"),
        ),
    ),
    C(
        "founded_order_yesno",
        "company",
        "founded_year",
        True,
        (
            ("Was {a} founded before {b}?", "lt"),
            ("Is {a} older than {b}?", "lt"),
            ("Was {a} established after {b}?", "gt"),
        ),
    ),
    C(
        "release_order_yesno",
        "work",
        "release_year",
        True,
        (
            ("Was the {noun} {a} released before {b}?", "lt"),
            ("Did the {noun} {a} come out after {b}?", "gt"),
        ),
    ),
    C(
        "birth_order_pick",
        "person",
        "birth_year",
        False,
        (
            ("Who was born first, {a} or {b}?", "min"),
            ("Which person is older, {a} or {b}?", "min"),
            ("Who was born later, {a} or {b}?", "max"),
        ),
    ),
    C(
        "founded_order_pick",
        "company",
        "founded_year",
        False,
        (
            ("Which company was founded earlier, {a} or {b}?", "min"),
            ("Which company is older, {a} or {b}?", "min"),
            ("Which company was founded more recently, {a} or {b}?", "max"),
        ),
    ),
    C(
        "release_order_pick",
        "work",
        "release_year",
        False,
        (
            ("Which {noun} came out first, {a} or {b}?", "min"),
            ("Which {noun} was released later, {a} or {b}?", "max"),
        ),
    ),
)

# Share of questions per family; split evenly among the family's templates. Yes/no questions are kept
# to 12% so that "always yes" (or any memorised answer) is worth little overall.
FAMILY_SHARE = {"bridge2": 0.45, "bridge3": 0.25, "yes_no": 0.12, "pick": 0.18}


def template_weights() -> list[tuple[BridgeTemplate | ComparisonTemplate, float]]:
    families = {
        "bridge2": [t for t in BRIDGE_TEMPLATES if t.hops == 2],
        "bridge3": [t for t in BRIDGE_TEMPLATES if t.hops == 3],
        "yes_no": [t for t in COMPARISON_TEMPLATES if t.yes_no],
        "pick": [t for t in COMPARISON_TEMPLATES if not t.yes_no],
    }
    out: list[tuple[BridgeTemplate | ComparisonTemplate, float]] = []
    for family, templates in families.items():
        out += [(t, FAMILY_SHARE[family] / len(templates)) for t in templates]
    return out
