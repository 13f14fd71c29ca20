"""A training mix: a seeded sample of N questions from each of several question files, shuffled together
(R²AG trains on 500 HotpotQA + 3,000 2Wiki + 1,174 MuSiQue questions and validates on 150 2Wiki + 150
MuSiQue; ``ragrl data mix``). A question id appearing in two sources, or a source with fewer questions
than asked for, is an error naming the file; ``exclude`` leaves out the ids of other files (a validation
mix drawn after the training mix never shares a question with it)."""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from ragrl.data.io import read_examples
from ragrl.data.schema import Example
from ragrl.errors import RagrlError


def parse_take(spec: str) -> tuple[Path, int | None]:
    """``FILE:N`` (N questions of FILE) or ``FILE`` (all of them; a file whose name holds a ``:`` is
    taken whole when it exists)."""
    path, sep, count = spec.rpartition(":")
    if not sep or Path(spec).exists():
        return Path(spec), None
    if re.fullmatch(r"\s*[+-]?\d+\s*", count):
        if int(count) < 1:
            raise RagrlError(f"--take {spec}: the count must be >= 1")
        return Path(path), int(count)
    if Path(path).is_file():  # FILE:something that is not a count
        raise RagrlError(f"--take {spec}: not FILE:N (what follows the last ':' is not a whole number)")
    return Path(spec), None  # a path with a ':' (C:/data.jsonl); reading it names it when it is missing


def mix(
    sources: Sequence[tuple[Path, int | None]],
    seed: int,
    exclude: Iterable[str] = (),
    on_warning: Callable[[str], None] | None = None,
) -> list[Example]:
    """``n`` questions drawn without replacement from each source (all when ``n`` is None), in a seeded
    order; the mix is shuffled with the same seed. Each question's ``metadata["mix_source"]`` names its
    file. ``on_warning`` hears what reading a source reported (a field a canonical record does not
    keep)."""
    rng = random.Random(seed)
    excluded, seen, out = set(exclude), {}, []
    for path, n in sources:
        examples, report = read_examples(path)
        for warning in report.warnings if on_warning is not None else ():
            on_warning(warning)
        examples = [ex for ex in examples if ex.id not in excluded]
        if n is not None and n > len(examples):
            raise RagrlError(f"{path}: asked for {n} questions, it has {len(examples)} (after exclusions)")
        picked = rng.sample(examples, n) if n is not None else list(examples)
        for ex in picked:
            if ex.id in seen:
                raise RagrlError(f"{path}: question id {ex.id!r} is also in {seen[ex.id]}")
            seen[ex.id] = path
            ex.metadata["mix_source"] = str(path)
            out.append(ex)
    rng.shuffle(out)
    return out
