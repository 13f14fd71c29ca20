"""Scripted policies that write Search-R1-format turns: the warm start's teachers and the baselines.

A demonstrator produces the text of the next policy turn from the question and the episode so far::

    <think> I need the founder of Zorvex Labs. </think>
    <search> Who founded Zorvex Labs? </search>

or ``<think> ... </think>\n<answer> Mira Tolan </answer>``. It is played through the real rollout by
``ragrl.rollout.scripted.DemonstratorBackend``, which hands it the episode so far as typed turns
(``Turn``: its text, the observation, the action the protocol parsed, the passages a search
retrieved): a demonstrator reads those, never the text of an observation.

* ``OracleDemonstrator`` follows the gold decomposition (one search per hop, with the gold
  intermediate answers substituted), then answers the gold answer, or ``unknown`` for an
  unanswerable question.
* ``QuotingOracle`` searches the entity each hop is about (the supporting passages' titles, in chain
  order) and, after each search, quotes the sentence of the retrieved passage that names what it
  needs next: reading is copying a sentence, then a name out of it (the tiny policy's demo teacher).
* ``HeuristicDemonstrator`` searches the question verbatim once, then reads an answer off the
  retrieved passages with a simple rule (a name gazetteer of the world stands in for an entity
  tagger); it never looks at gold fields.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from ragrl.data.io import read_text
from ragrl.data.schema import Example, Passage
from ragrl.errors import RagrlError
from ragrl.rollout.scripted import Turn
from ragrl.synth.questions import UNANSWERABLE_ANSWER

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
SEARCH_OPEN, SEARCH_CLOSE = "<search>", "</search>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"

_YEAR_RE = re.compile(r"\b(1[5-9]\d\d|20\d\d)\b")


class EvaluationPhrases:
    """What Eval-RAR's oracle (``ragrl.methods.eval_rar.EvalRarOracle``) writes inside ``<evaluate>``."""

    found = "The documents give {found}."
    not_found = "The documents do not give the fact I searched for."
    missing = "Still missing: {need}"
    answerable = "This answers the question: {answer}."
    unanswerable = "The documents do not contain the fact I need."

    @classmethod
    def all(cls) -> list[str]:
        return [cls.found, cls.not_found, cls.missing, cls.answerable, cls.unanswerable]


def demonstrator_texts() -> list[str]:
    """The fixed phrases the demonstrators write (their thoughts), for a tokenizer's training texts: a
    policy warm-started on demonstrations should be able to spell every word of them."""
    return [
        "To answer this I first need: I found it. Next I need: So the answer is",
        "The documents do not contain the fact I need.",
        "I know it.",
        "I found nothing about it",
        "Let me search for the question.",
        "I will answer from the retrieved documents.",
        *(phrase.format(found="", need="", answer="") for phrase in EvaluationPhrases.all()),
    ]


def search_turn(thought: str, query: str) -> str:
    return f"{THINK_OPEN} {thought} {THINK_CLOSE}\n{SEARCH_OPEN} {query} {SEARCH_CLOSE}"


def answer_turn(thought: str, answer: str) -> str:
    return f"{THINK_OPEN} {thought} {THINK_CLOSE}\n{ANSWER_OPEN} {answer} {ANSWER_CLOSE}"


class OracleDemonstrator:
    """Searches each gold sub-question in order, then answers the gold answer (``unknown`` when the
    question is unanswerable). Uses gold fields: it is an upper bound, and a source of SFT traces.

    On real data: a MuSiQue-style ``#k`` in a sub-question becomes the gold answer of step k; a question
    without a decomposition (HotpotQA, 2Wiki) searches the title of each of its supporting passages in
    turn (the entity each hop is about), then answers."""

    name = "oracle"

    def next_turn(self, example: Example, history: list[Turn]) -> str:
        queries, found, summary = _search_plan(example)
        t = len(history)
        if t < len(queries):
            if t == 0:
                thought = f"To answer this I first need: {queries[t]}"
            else:
                thought = f"I found {found[t - 1]}. Next I need: {queries[t]}"
            return search_turn(thought, queries[t])
        if not example.answerable:
            return answer_turn("The documents do not contain the fact I need.", UNANSWERABLE_ANSWER)
        thought = f"I found {summary}. So the answer is {example.answers[0]}." if queries else "I know it."
        return answer_turn(thought, example.answers[0])


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


class QuotingOracle:
    """Searches the entity each hop is about (the supporting passages' titles in chain order: the query
    is a name copied from the question or from the last quote) and, after each search, quotes the
    evidence sentence before acting on it::

        <think> I need Mertaem Breke </think>
        <search> Mertaem Breke </search>
        <think> Mertaem Breke is a musician who was born in Zurraes in 1965 </think>
        <search> Zurraes </search>
        <think> Zurraes is a city in Boreora with a population of about 573,000 </think>
        <answer> Boreora </answer>

    The quote is the first sentence of the passages this search retrieved (the hop's own passage
    first) that names the next hop's entity, or the answer at the last hop (as a whole word); failing
    that, a sentence with a year (what comparisons compare), else the first sentence of the top
    passage. Only retrieved text is quoted: the teacher never states a fact the policy could not see.
    Unanswerable questions are answered ``unknown`` after the searches (one search for the question
    when every supporting passage was removed); an answerable question without supporting titles is
    an error. Uses gold fields: an upper bound and a source of SFT traces, like
    ``OracleDemonstrator``, whose sub-question queries retrieve their fact far less often under BM25
    (docs/training.md)."""

    name = "quote"

    def next_turn(self, example: Example, history: list[Turn]) -> str:
        titles = supporting_titles(example)
        answerable = example.answerable
        if not titles:
            if answerable:
                raise RagrlError(
                    f"question {example.id}: the quoting oracle needs the titles of its supporting passages "
                    "(supporting_ids and passages); use the oracle demonstrator for questions without them"
                )
            titles = [example.question]  # every supporting passage removed: look once, then refuse
        t = len(history)
        if t < len(titles):
            thought = f"I need {titles[0]}" if t == 0 else self.quote(example, titles, history)
            return search_turn(thought, titles[t])
        if not answerable:
            return answer_turn("I found nothing about it", UNANSWERABLE_ANSWER)
        return answer_turn(self.quote(example, titles, history), example.answers[0])

    @staticmethod
    def quote(example: Example, titles: list[str], history: list[Turn]) -> str:
        """The evidence sentence after the last search (class docstring)."""
        t = min(len(history), len(titles))
        need = titles[t] if t < len(titles) else example.answers[0]
        return evidence_sentence(history[-1].passages, titles[t - 1], need) or "I found nothing"

    @staticmethod
    def read_given(example: Example) -> list[GivenQuote]:
        """What this oracle reads when the passages are given rather than searched: for each hop in chain
        order, its own passage among ``example.passages`` (a supporting one with the hop's title) from
        its start through the evidence sentence (the one it quotes after a search, by the same rule): a
        copy of the passage as it stands, as a search result is read from its top. ``[]`` for a
        question without supporting titles; a hop whose passage has no text is left out."""
        titles = supporting_titles(example)
        if not titles:
            return []
        needs = [*titles[1:], example.answers[0] if example.answers else ""]
        supporting = set(example.supporting_ids or [])
        numbered = [(i, p) for i, p in enumerate(example.passages or [], 1) if p.id in supporting]
        out = []
        for hop, need in zip(titles, needs, strict=True):
            index, own = next((i, p) for i, p in numbered if p.title == hop)  # a title comes from them
            evidence = evidence_sentence([own], hop, need)
            if evidence is None:
                continue
            end = own.text.index(evidence) + len(evidence)
            if own.text[end : end + 1] in {".", "!", "?"}:  # the sentence's own full stop
                end += 1
            out.append(GivenQuote(hop, index, own.text[:end]))
        return out


@dataclass(frozen=True)
class GivenQuote:
    """One hop as ``QuotingOracle.read_given`` reads it: the entity, the 1-based number of its passage
    among the given ones, and the passage from its start through the evidence sentence."""

    title: str
    index: int
    quote: str


def evidence_sentence(passages: list[Passage], hop: str, need: str) -> str | None:
    """The quoting oracle's evidence: the first sentence of ``passages`` (the one titled ``hop`` first)
    that names ``need`` as a whole word, else one with a year, else the first; None without text."""
    passages = sorted(passages, key=lambda p: p.title != hop)
    sentences = [s.strip().rstrip(".") for p in passages for s in _SENTENCE_END.split(p.text) if s.strip()]
    if not sentences:
        return None
    tests = [_YEAR_RE.search]
    if need:  # without an answer to name, the year rule decides
        tests.insert(0, re.compile(rf"(?<!\w){re.escape(need)}(?!\w)").search)  # "no" is not in "novelist"
    for test in tests:
        found = next((s for s in sentences if test(s)), None)
        if found:
            return found
    return sentences[0]


def _search_plan(example: Example) -> tuple[list[str], list[str], str]:
    """What the oracle searches, what each search finds, and how it sums up its findings: the gold
    decomposition's sub-questions (``#k`` filled) and their answers, else the supporting passages'
    titles (each finding is "it")."""
    steps = example.decomposition or []
    if steps:
        answers = [s.answers[0] if s.answers else "" for s in steps]
        return [_fill_step_refs(s.question, answers) for s in steps], answers, ", ".join(answers)
    titles = supporting_titles(example)
    return titles, ["it"] * len(titles), "it"


_STEP_REF_RE = re.compile(r"#(\d+)")


def _fill_step_refs(question: str, answers: list[str]) -> str:
    """``question`` with each ``#k`` (MuSiQue's reference to the answer of step k) replaced by it."""

    def sub(m: re.Match[str]) -> str:
        k = int(m.group(1))
        return answers[k - 1] if 1 <= k <= len(answers) and answers[k - 1] else m.group(0)

    return _STEP_REF_RE.sub(sub, question)


def supporting_titles(example: Example) -> list[str]:
    """The distinct titles of a question's supporting passages, in the order of its supporting ids."""
    by_id = {p.id: p.title for p in example.passages or []}
    titles: list[str] = []
    for pid in example.supporting_ids or []:
        title = by_id.get(pid, "")
        if title and title not in titles:
            titles.append(title)
    return titles


_LT_WORDS = ("before", "earlier", "older", "first")
_GT_WORDS = ("after", "later", "recently")
_PICK_RE = re.compile(r",\s*(.+?)\s+or\s+(.+?)\?\s*$")


def answer_kind(question: str) -> str:
    """The kind of answer a question asks for, from its wording: yes/no, pick, country, city, year,
    company or person."""
    q = question.strip()
    low = q.lower()
    if re.match(r"^(was|is|did|does|were)\b", low):
        return "yes/no"
    if _PICK_RE.search(q):
        return "pick"
    if "capital" in low:
        return "city"
    if "country" in low:
        return "country"
    if "year" in low or low.startswith("when"):
        return "year"
    if low.startswith("who employs") or "which company" in low:
        return "company"
    if low.startswith("who"):
        return "person"
    return "city"


class HeuristicDemonstrator:
    """Searches the question verbatim, then answers from the retrieved text only.

    * bridge: the first name of the asked-for kind (gazetteer lookup, or a year) in the retrieved
      documents, in rank order, that is not in the question; ``unknown`` if there is none;
    * yes/no and pick-one: the first year in each compared entity's document; compare them
      ("before/earlier/older/first" vs "after/later/recently"); "yes" / the first option if a year is
      missing.
    """

    name = "heuristic"

    def __init__(self, gazetteer: dict[str, str]) -> None:
        self.gazetteer = gazetteer  # entity name -> kind
        by_kind: dict[str, list[str]] = {}
        for name, kind in gazetteer.items():
            by_kind.setdefault(kind, []).append(name)
        self._patterns = {
            kind: re.compile(
                r"\b(" + "|".join(re.escape(n) for n in sorted(names, key=lambda n: (-len(n), n))) + r")\b"
            )
            for kind, names in by_kind.items()
        }

    @classmethod
    def from_world(cls, world) -> HeuristicDemonstrator:
        return cls({e.name: e.kind for e in world.store})

    @classmethod
    def from_world_json(cls, path: str | Path) -> HeuristicDemonstrator:
        data = json.loads(read_text(path))
        return cls({e["name"]: e["kind"] for e in data["entities"]})

    def next_turn(self, example: Example, history: list[Turn]) -> str:
        if not history:
            return search_turn("Let me search for the question.", example.question)
        shown = history[-1]  # the passages whose title the observation showed (it may have been cut)
        docs = [(p.title, p.text) for p in shown.passages if p.title in shown.observation]
        answer = self.guess(example.question, docs)
        return answer_turn("I will answer from the retrieved documents.", answer)

    def _year_of(self, name: str, docs: list[tuple[str, str]]) -> int | None:
        for title, text in docs:
            if title == name:
                m = _YEAR_RE.search(text)
                if m:
                    return int(m.group(1))
        return None

    def guess(self, question: str, docs: list[tuple[str, str]]) -> str:
        kind = answer_kind(question)
        low = question.lower()
        if kind in ("yes/no", "pick"):
            if kind == "pick":
                a, b = _PICK_RE.search(question).groups()  # type: ignore[union-attr]
            else:
                names = [m.group(1) for p in self._patterns.values() for m in p.finditer(question)]
                names.sort(key=question.index)
                if len(names) < 2:
                    return "yes"
                a, b = names[0], names[1]
            ya, yb = self._year_of(a, docs), self._year_of(b, docs)
            wants_min = any(w in low for w in _LT_WORDS) and not any(w in low for w in _GT_WORDS)
            if ya is None or yb is None or ya == yb:
                return "yes" if kind == "yes/no" else a
            if kind == "pick":
                return a if (ya < yb) == wants_min else b
            return "yes" if (ya < yb) == wants_min else "no"
        for title, text in docs:
            content = f"{title}\n{text}"
            if kind == "year":
                found = [m.group(1) for m in _YEAR_RE.finditer(content)]
            else:
                pattern = self._patterns.get(kind)
                found = [m.group(1) for m in pattern.finditer(content)] if pattern else []
            for cand in found:
                if cand not in question:
                    return cand
        return UNANSWERABLE_ANSWER


DEMONSTRATORS = ("oracle", "quote", "heuristic")
"""The world's demonstrators by name: ``ragrl eval --demonstrator`` and ``ragrl train sft --demos``."""


def demonstrator_by_name(name: str, world_json: Path):
    """The world's demonstrator called ``name``: ``oracle`` (the search oracle), ``quote`` (the quoting
    oracle) or ``heuristic`` (it reads the gazetteer from ``world_json``, which only it needs)."""
    if name == "oracle":
        return OracleDemonstrator()
    if name == "quote":
        return QuotingOracle()
    if name == "heuristic":
        if not world_json.is_file():
            raise RagrlError(
                f"the heuristic demonstrator needs the world's gazetteer: {world_json} not found (--world)"
            )
        return HeuristicDemonstrator.from_world_json(world_json)
    raise RagrlError(f"unknown demonstrator {name!r} (expected {', '.join(DEMONSTRATORS)})")
