"""``SynthWorld``: a generated world (its entities, passages, question splits and corpus) and the files
it writes (``<split>.jsonl``, ``corpus.jsonl``, ``world.json``, ``stats.json``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ragrl.data.io import write_corpus, write_examples
from ragrl.data.schema import Example, Passage
from ragrl.synth.world import DEFAULT_SPLIT_MODE, Entity, EntityStore


@dataclass
class SynthWorld:
    seed: int
    size: str
    store: EntityStore
    passages: dict[str, Passage]  # entity id -> its passage
    splits: dict[str, list[Example]]
    corpus: list[Passage]  # every passage except the removed ones
    removed_ids: list[str]
    split: str = DEFAULT_SPLIT_MODE
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def entities(self) -> list[Entity]:
        return list(self.store)

    def entity_by_name(self, name: str) -> Entity:
        for e in self.store:
            if e.name == name:
                return e
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        """Entities, relations (as triples) and the removed passages: ``world.json``."""
        triples = []
        for e in self.store:
            for rel, target in e.rels.items():
                triples.append([e.id, rel, target])
            for fact, value in e.facts.items():
                if fact.endswith("_year"):
                    triples.append([e.id, fact, value])
        return {
            "seed": self.seed,
            "size": self.size,
            "split": self.split,
            "entities": [e.to_dict() for e in self.store],
            "relations": triples,
            "removed_passage_ids": list(self.removed_ids),
        }

    def write(self, out: str | Path) -> dict[str, Path]:
        """Write the split files, ``corpus.jsonl``, ``world.json`` and ``stats.json`` under ``out``."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        paths = {}
        for split, examples in self.splits.items():
            paths[split] = out / f"{split}.jsonl"
            write_examples(paths[split], examples)
        paths["corpus"] = out / "corpus.jsonl"
        write_corpus(paths["corpus"], self.corpus)
        for name, obj in (("world", self.to_json()), ("stats", self.stats)):
            paths[name] = out / f"{name}.json"
            text = json.dumps(obj, ensure_ascii=False, indent=1, sort_keys=False) + "\n"
            _write_text(paths[name], text)
        return paths


def _write_text(path: Path, text: str) -> None:
    # written to a temp file and renamed, so a reader never sees half a file
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
