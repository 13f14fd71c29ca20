"""The worlds a reader base reads (``ragrl.train.reader``, step 1): synthetic worlds that state no fact a
protected world's held-out question needs, one more for validation, and their text for the tokenizer."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ragrl.errors import RagrlError


@dataclass
class PretrainingWorlds:
    """The worlds a base reads, the candidates skipped for a shared fact, and the fairness report."""

    worlds: list[Any]
    skipped: dict[int, int] = field(default_factory=dict)
    """Seed of a skipped candidate -> the number of protected held-out facts it states."""
    validation: Any = None
    report: dict[str, Any] = field(default_factory=dict)


def choose_worlds(worlds: int, first_seed: int, size: str, protected: Sequence[int]) -> PretrainingWorlds:
    """``worlds`` worlds of ``size`` from seed ``first_seed`` on that state no fact a ``protected`` world's
    held-out question needs and ask none of its held-out questions (``ragrl.synth.fairness``; every split
    mode of every protected seed), then the first such world after them that none of the chosen ones
    states a held-out fact of, for validation."""
    from ragrl.synth.fairness import (
        all_questions,
        cross_world_overlap,
        held_out_named_facts,
        held_out_questions,
        shared_facts,
    )
    from ragrl.synth.generate import generate_world
    from ragrl.synth.world import SPLIT_MODES

    protected = [generate_world(seed, size, split=mode) for seed in protected for mode in SPLIT_MODES]
    needed = set().union(*(held_out_named_facts(w) for w in protected))  # at least one seed is protected
    asked = set().union(*(held_out_questions(w) for w in protected))
    chosen: list[Any] = []
    skipped: dict[int, int] = {}
    seed = first_seed
    validation = None
    while validation is None:
        world = generate_world(seed, size)
        shared = len(shared_facts(world, needed)) + len(all_questions(world) & asked)
        if len(chosen) == worlds and not shared:  # the validation world: unseen by the chosen ones
            unseen = held_out_named_facts(world)
            shared = sum(len(shared_facts(r, unseen)) for r in chosen)
            shared += sum(len(all_questions(r) & held_out_questions(world)) for r in chosen)
        if shared:
            skipped[seed] = shared
        elif len(chosen) < worlds:
            chosen.append(world)
        else:
            validation = world
        seed += 1
        if seed - first_seed > 10 * (worlds + 1) + 100:
            raise RagrlError("reader base: too many candidate worlds share a fact with the protected ones")
    report = cross_world_overlap(chosen, protected)
    report["validation_shared_facts"] = 0
    report["skipped_seeds"] = {str(s): n for s, n in skipped.items()}
    return PretrainingWorlds(chosen, skipped, validation, report)


def world_texts(world: Any) -> list[str]:
    """A world's text for the tokenizer: its passages (title and text), questions and answers."""
    texts = [f"{p.title} {p.text}" for p in world.corpus]
    for examples in world.splits.values():
        for ex in examples:
            texts.append(ex.question)
            texts.extend(ex.answers)
    return texts
