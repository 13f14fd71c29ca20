"""The typed records every part of ragrl exchanges: ``Passage``, ``SubQuestion`` and ``Example``.

On disk they use FlashRAG's conventions, so files interoperate with FlashRAG, Search-R1 and verl:

* question file (jsonl), one record per line::

      {"id": "...", "question": "...", "golden_answers": ["...", ...], "metadata": {...}}

* corpus file (jsonl), one passage per line::

      {"id": "...", "contents": "Title\\ntext"}

ragrl keeps its structured fields inside ``metadata`` under reserved keys (all optional):

``supporting_ids``   list of passage ids that support the answer (gold evidence), in dataset order.
``passages``         the passages given with the question (distractor setting), in their original
                     order, each ``{"id", "title", "text"}``.
``decomposition``    the gold reasoning chain, each step ``{"question", "answers", "supporting_ids"}``.

Any other metadata key is the dataset's own and is carried through unchanged (for example ``source``,
``type``, ``level``, ``hops``, ``answerable``, ``supporting_facts``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from ragrl.errors import DataError

RESERVED_METADATA_KEYS = ("supporting_ids", "passages", "decomposition")


def passage_id(title: str, text: str) -> str:
    """A stable id derived from a passage's content.

    The same (title, text) gets the same id in every file and every dataset, so corpora built from
    different question files merge and deduplicate by id alone.
    """
    digest = hashlib.sha1(f"{title}\n{text}".encode()).hexdigest()
    return "p" + digest[:16]


@dataclass(frozen=True, slots=True)
class Passage:
    id: str
    title: str
    text: str

    @classmethod
    def make(cls, title: str, text: str) -> Passage:
        """A passage whose id is derived from its content (see ``passage_id``)."""
        title, text = title.strip(), text.strip()
        return cls(passage_id(title, text), title, text)

    @classmethod
    def from_contents(cls, id: str, contents: str, title: str | None = None) -> Passage:
        """Split FlashRAG's ``contents`` (``"title\\ntext"``) into title and text. A ``title`` given
        beside it is the title: the contents then begins with it and a newline (as FlashRAG writes it,
        quotes and newlines inside the title included) and the rest is the text, or the whole contents
        is the text under it (nothing is dropped). A blank ``title`` is none."""
        if title is not None and title.strip():
            body = contents.strip()
            for written in dict.fromkeys((title, title.strip(), f'"{title.strip()}"')):
                if body == written or body.startswith(written + "\n"):
                    return cls(str(id), title.strip(), body[len(written) :].strip())
            first = contents.partition("\n")[0].strip().strip('"')
            if first != title.strip():
                return cls(str(id), title.strip(), body)
        first, _, text = contents.partition("\n")
        return cls(str(id), first.strip().strip('"'), text.strip())

    @property
    def contents(self) -> str:
        return f"{self.title}\n{self.text}"

    @property
    def empty(self) -> bool:
        """Neither a title nor a text: no search could find it by its words (corpora refuse it)."""
        return not self.title.strip() and not self.text.strip()

    def to_corpus_record(self) -> dict[str, str]:
        """The canonical ``{id, contents}`` line, or ``{id, title, text}`` when contents would not give
        the passage back (a title with a newline, or in quotes, which ``from_contents`` strips)."""
        record = {"id": self.id, "contents": self.contents}
        return record if Passage.from_contents(self.id, record["contents"]) == self else self.to_dict()

    def to_dict(self) -> dict[str, str]:
        return {"id": self.id, "title": self.title, "text": self.text}


@dataclass(frozen=True, slots=True)
class SubQuestion:
    """One step of a gold decomposition: a sub-question, its answer(s) and its evidence."""

    question: str
    answers: tuple[str, ...]
    supporting_ids: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "question": self.question,
            "answers": list(self.answers),
            "supporting_ids": list(self.supporting_ids),
        }


@dataclass(slots=True)
class Example:
    id: str
    question: str
    answers: list[str]
    supporting_ids: list[str] = field(default_factory=list)
    passages: list[Passage] | None = None
    decomposition: list[SubQuestion] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def answerable(self) -> bool:
        """False only for a question marked ``metadata.answerable: false`` (one without the flag is
        answerable: most datasets have none)."""
        return self.metadata.get("answerable", True) is not False

    def to_record(self) -> dict[str, Any]:
        """The canonical (FlashRAG-style) question record."""
        metadata = dict(self.metadata)
        if self.supporting_ids:
            metadata["supporting_ids"] = list(self.supporting_ids)
        if self.passages is not None:
            metadata["passages"] = [p.to_dict() for p in self.passages]
        if self.decomposition is not None:
            metadata["decomposition"] = [s.to_dict() for s in self.decomposition]
        return {
            "id": self.id,
            "question": self.question,
            "golden_answers": list(self.answers),
            "metadata": metadata,
        }

    @classmethod
    def from_record(cls, record: Any, *, path: str | None = None, line: int | None = None) -> Example:
        """Parse and validate a canonical question record; errors name the file, line and field."""

        def fail(message: str, field_name: str | None = None) -> DataError:
            return DataError(message, path=path, line=line, field=field_name)

        if not isinstance(record, dict):
            raise fail(f"expected a JSON object, got {type(record).__name__}")
        for key in ("id", "question", "golden_answers"):
            if key not in record:
                raise fail("missing", key)
        ex_id = record["id"]
        if not isinstance(ex_id, (str, int)) or isinstance(ex_id, bool) or str(ex_id) == "":
            raise fail("must be a non-empty string or integer", "id")
        question = record["question"]
        if not isinstance(question, str) or not question.strip():
            raise fail("must be a non-empty string", "question")
        answers = record["golden_answers"]
        if isinstance(answers, str):
            answers = [answers]
        if not isinstance(answers, list) or not all(isinstance(a, str) for a in answers):
            raise fail("must be a list of strings", "golden_answers")
        metadata = record.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise fail("must be an object", "metadata")
        metadata = dict(metadata)
        if not isinstance(metadata.get("answerable", True), bool):
            raise fail("must be true or false", "metadata.answerable")

        supporting_ids = metadata.pop("supporting_ids", [])
        if not isinstance(supporting_ids, list) or not all(isinstance(s, str) for s in supporting_ids):
            raise fail("must be a list of passage id strings", "metadata.supporting_ids")

        passages = None
        if "passages" in metadata:
            raw = metadata.pop("passages")
            if not isinstance(raw, list):
                raise fail("must be a list", "metadata.passages")
            passages = []
            for i, p in enumerate(raw):
                name = f"metadata.passages[{i}]"
                if not isinstance(p, dict):
                    raise fail("must be an object", name)
                if "contents" in p and not (
                    isinstance(p.get("title"), str) and isinstance(p.get("text"), str)
                ):
                    if "id" not in p:
                        raise fail("missing", f"{name}.id")
                    if p.get("title") is not None and not isinstance(p["title"], str):
                        raise fail("must be a string", f"{name}.title")
                    passages.append(Passage.from_contents(p["id"], str(p["contents"]), p.get("title")))
                    continue
                for key in ("id", "title", "text"):
                    if not isinstance(p.get(key), str):
                        raise fail("missing or not a string", f"{name}.{key}")
                passages.append(Passage(p["id"], p["title"], p["text"]))

        decomposition = None
        if "decomposition" in metadata:
            raw = metadata.pop("decomposition")
            if not isinstance(raw, list):
                raise fail("must be a list", "metadata.decomposition")
            decomposition = []
            for i, s in enumerate(raw):
                name = f"metadata.decomposition[{i}]"
                if not isinstance(s, dict) or not isinstance(s.get("question"), str):
                    raise fail("must be an object with a string 'question'", name)
                step_answers = s.get("answers", [])
                if isinstance(step_answers, str):
                    step_answers = [step_answers]
                if not isinstance(step_answers, list) or not all(isinstance(a, str) for a in step_answers):
                    raise fail("must be a string or a list of strings", f"{name}.answers")
                step_ids = s.get("supporting_ids", [])
                if not isinstance(step_ids, list) or not all(isinstance(x, str) for x in step_ids):
                    raise fail("must be a list of passage id strings", f"{name}.supporting_ids")
                decomposition.append(SubQuestion(s["question"], tuple(step_answers), tuple(step_ids)))

        return cls(
            id=str(ex_id),
            question=question,
            answers=list(answers),
            supporting_ids=list(supporting_ids),
            passages=passages,
            decomposition=decomposition,
            metadata=metadata,
        )
