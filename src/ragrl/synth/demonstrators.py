"""Scripted policies that write Search-R1-format turns, and a small simulator to measure them.

A demonstrator produces the text of the next policy turn from the question and the episode so far::

    <think> I need the founder of Zorvex Labs. </think>
    <search> Who founded Zorvex Labs? </search>

or ``<think> ... </think>\\n<answer> Mira Tolan </answer>``. A search turn ends right after
``</search>`` (a stop string); the environment then appends an observation: an ``<information>``
block with the retrieved passages rendered as ``Doc 1 (Title: ...) text`` lines, or a corrective
message. The exact text format lives in the constants below, in one place.

* ``OracleDemonstrator`` follows the gold decomposition (one search per hop, with the gold
  intermediate answers substituted), then answers the gold answer, or ``unknown`` for an
  unanswerable question.
* ``HeuristicDemonstrator`` searches the question verbatim once, then reads an answer off the
  retrieved text with a simple rule (a name gazetteer of the world stands in for an entity tagger);
  it never looks at gold fields.

``simulate(demonstrator, examples, retriever)`` runs them against a real retriever before the rollout
engine exists (batched per turn), and returns the predicted answers.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ragrl.data.schema import Example, Passage
from ragrl.synth.questions import UNANSWERABLE_ANSWER

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
SEARCH_OPEN, SEARCH_CLOSE = "<search>", "</search>"
INFORMATION_OPEN, INFORMATION_CLOSE = "<information>", "</information>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
STOP_STRINGS = (SEARCH_CLOSE, ANSWER_CLOSE)
DOC_LINE = "Doc {i} (Title: {title}) {text}"
INVALID_ACTION_MESSAGE = (
    "\nMy previous action is invalid. If I want to search, I should put the query between <search> and "
    "</search>. If I want to give the final answer, I should put the answer between <answer> and "
    "</answer>. Let me try again.\n"
)

_DOC_RE = re.compile(r"Doc\s*(\d+)\s*\(Title:\s*(.*?)\)\s*(.*)")
_TAG_RE = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)
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
        "Let me search for the question.",
        "I will answer from the retrieved documents.",
        *(phrase.format(found="", need="", answer="") for phrase in EvaluationPhrases.all()),
    ]


def search_turn(thought: str, query: str) -> str:
    return f"{THINK_OPEN} {thought} {THINK_CLOSE}\n{SEARCH_OPEN} {query} {SEARCH_CLOSE}"


def answer_turn(thought: str, answer: str) -> str:
    return f"{THINK_OPEN} {thought} {THINK_CLOSE}\n{ANSWER_OPEN} {answer} {ANSWER_CLOSE}"


def render_information(passages: Sequence[Passage]) -> str:
    """The observation appended after a search: one ``Doc i (Title: t) text`` line per passage."""
    lines = [DOC_LINE.format(i=i, title=p.title, text=p.text) for i, p in enumerate(passages, start=1)]
    return f"\n\n{INFORMATION_OPEN}\n" + "\n".join(lines) + f"\n{INFORMATION_CLOSE}\n\n"


def extract_retrieved(observation: str) -> list[tuple[str, str]]:
    """``(title, text)`` of every ``Doc i (Title: ...) ...`` line of an observation, in order."""
    inner = observation
    if INFORMATION_OPEN in observation:
        inner = observation.split(INFORMATION_OPEN, 1)[1].split(INFORMATION_CLOSE, 1)[0]
    return [(m.group(2).strip(), m.group(3).strip()) for m in map(_DOC_RE.match, inner.splitlines()) if m]


def extract_retrieved_titles(observation: str) -> list[str]:
    return [title for title, _ in extract_retrieved(observation)]


def parse_turn(text: str) -> tuple[str, str]:
    """``("search", query)``, ``("answer", answer)`` or ``("invalid", "")``: the first complete
    search or answer tag of a turn."""
    m = _TAG_RE.search(text)
    if not m:
        return "invalid", ""
    return m.group(1), m.group(2).strip()


class Demonstrator(Protocol):
    name: str

    def next_turn(self, example: Example, history: list[tuple[str, str]]) -> str: ...


class OracleDemonstrator:
    """Searches each gold sub-question in order, then answers the gold answer (``unknown`` when the
    question is unanswerable). Uses gold fields: it is an upper bound, and a source of SFT traces."""

    name = "oracle"

    def next_turn(self, example: Example, history: list[tuple[str, str]]) -> str:
        steps = example.decomposition or []
        t = len(history)
        if t < len(steps):
            step = steps[t]
            if t == 0:
                thought = f"To answer this I first need: {step.question}"
            else:
                thought = f"I found {steps[t - 1].answers[0]}. Next I need: {step.question}"
            return search_turn(thought, step.question)
        if example.metadata.get("answerable", True) is False:
            return answer_turn("The documents do not contain the fact I need.", UNANSWERABLE_ANSWER)
        found = ", ".join(s.answers[0] for s in steps)
        thought = f"I found {found}. So the answer is {example.answers[0]}." if steps else "I know it."
        return answer_turn(thought, example.answers[0])


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
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        return cls({e["name"]: e["kind"] for e in data["entities"]})

    def next_turn(self, example: Example, history: list[tuple[str, str]]) -> str:
        if not history:
            return search_turn("Let me search for the question.", example.question)
        docs = extract_retrieved(history[-1][1])
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


@dataclass
class Episode:
    """One simulated episode: the (policy text, observation) turns and what was searched."""

    turns: list[tuple[str, str]] = field(default_factory=list)
    queries: list[str] = field(default_factory=list)
    retrieved: list[list[str]] = field(default_factory=list)  # passage ids per search
    prediction: str = ""
    answered: bool = False


def simulate_episodes(
    demonstrator: Demonstrator, examples: Sequence[Example], retriever, k: int = 3, max_turns: int = 4
) -> list[Episode]:
    """Run ``demonstrator`` on every example against ``retriever`` (one batched search per turn)."""
    episodes = [Episode() for _ in examples]
    active = list(range(len(examples)))
    for _turn in range(max_turns):
        if not active:
            break
        texts = {i: demonstrator.next_turn(examples[i], episodes[i].turns) for i in active}
        searches = []
        still = []
        for i in active:
            action, arg = parse_turn(texts[i])
            if action == "answer":
                episodes[i].prediction, episodes[i].answered = arg, True
                episodes[i].turns.append((texts[i], ""))
            elif action == "search":
                searches.append((i, arg))
                still.append(i)
            else:
                episodes[i].turns.append((texts[i], INVALID_ACTION_MESSAGE))
                still.append(i)
        results = retriever.search([q for _, q in searches], k) if searches else []
        for (i, query), hits in zip(searches, results, strict=True):
            passages = [h.passage for h in hits]
            episodes[i].queries.append(query)
            episodes[i].retrieved.append([p.id for p in passages])
            episodes[i].turns.append((texts[i], render_information(passages)))
        active = still
    return episodes


def simulate(
    demonstrator: Demonstrator, examples: Sequence[Example], retriever, k: int = 3, max_turns: int = 4
) -> list[str]:
    """The predicted answer of every example ("" when the episode ended without an answer)."""
    return [ep.prediction for ep in simulate_episodes(demonstrator, examples, retriever, k, max_turns)]


def gold_hit_rate(episodes: Sequence[Episode], examples: Sequence[Example]) -> float:
    """Share of searches (matched to decomposition steps in order) whose results contain that step's
    gold passage; for the oracle this is the per-hop retrieval recall@k of the gold sub-questions.
    Steps whose passage is not in the corpus (removed) are skipped."""
    hits = total = 0
    for ep, ex in zip(episodes, examples, strict=True):
        removed = set(ex.metadata.get("removed_passage_ids", ()))
        for step, got in zip(ex.decomposition or [], ep.retrieved, strict=False):
            gold = [pid for pid in step.supporting_ids if pid not in removed]
            if gold:
                total += 1
                hits += gold[0] in got
    return hits / total if total else 0.0
