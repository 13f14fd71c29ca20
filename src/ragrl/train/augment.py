"""Name-swap augmentation for SFT demonstrations and GRPO samples of the synthetic world.

A demonstration is a token sequence: the question, the policy's turns, and the retrieved passages.
``NameSwap`` renames the made-up entity names in one demonstration *consistently*: every occurrence
of a name word, in the prompt, in the policy's text and in the passages, becomes the same other name
word. The renamed demonstration is still a correct one (the passages say what the answer says), but
its facts are new, so the only way to predict its names is to copy them from the question and from
the passages. Without it a small policy learns the training questions' answers by heart instead
(see ``docs/training.md``: 0.30 EM on training questions, 0.03 on held-out ones).

Name words are the words of the world's entity names and aliases that belong to exactly one entity
(made-up words such as "Krionesland"; not "Labs" or "Echoes", which many names share). The
replacements are drawn from all of them, held-out ones included: a name word is a symbol here, and
a renamed demonstration teaches no fact about the entity whose name is borrowed. Only words that are
a single token of the policy's tokenizer can be swapped, so the augmentation needs a word-level
tokenizer (``ragrl model tiny --tokenizer word``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import random
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ragrl.data.io import read_text
from ragrl.data.schema import Example, Passage
from ragrl.errors import RagrlError
from ragrl.retrieval.base import Hit
from ragrl.rollout.sample import Sample
from ragrl.rollout.trajectory import Trajectory


def name_words(world_json: str | Path) -> set[str]:
    """The made-up name words of a synthetic world: words of exactly one entity's names and aliases."""
    path = Path(world_json)
    try:
        world = json.loads(read_text(path))
        entities = world["entities"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise RagrlError(f"{path}: not a synthetic world.json ({e})") from e
    owners: Counter[str] = Counter()
    for i, entity in enumerate(entities):
        try:
            names = [entity["name"], *entity.get("aliases", [])]
        except (KeyError, TypeError, AttributeError) as e:
            raise RagrlError(f"{path}: entities[{i}] has no name") from e
        owners.update({w for n in names for w in n.split()})
    return {w for w, n in owners.items() if n == 1}


class NameSwap:
    """Consistent renaming of name tokens in a trajectory (``__call__(trajectory, rng)``).

    Only token ids change (what the SFT loss reads); segment texts keep the original wording."""

    def __init__(self, spaced: list[int], bare: list[int]) -> None:
        # a word-level tokenizer has two tokens per word: " Word" (after a space) and "Word"; a
        # token is replaced by one of the same form so the text keeps its spacing
        self.spaced, self.bare = spaced, bare
        self._spaced_set, self._bare_set = set(spaced), set(bare)

    @classmethod
    def from_world(cls, world_json: str | Path, tokenizer: Any) -> NameSwap:
        words = name_words(world_json)
        vocab = tokenizer.get_vocab()
        spaced = sorted(vocab[" " + w] for w in words if " " + w in vocab)
        bare = sorted(vocab[w] for w in words if w in vocab)
        if len(spaced) < len(words) // 2:
            raise RagrlError(
                f"name swap: only {len(spaced)} of the {len(words)} name words of {world_json} are single "
                "tokens of the policy's tokenizer; it needs a word-level tokenizer (ragrl model tiny "
                "--tokenizer word)"
            )
        return cls(spaced, bare)

    @classmethod
    def for_run(cls, config: Any, tokenizer: Any, option: str) -> NameSwap:
        """The swap of a run's world: ``train.sft.world``, else the world.json next to
        ``train.data.train``; ``option`` (the setting that asked for it) names the error."""
        return cls.from_world(_world_json(config, option), tokenizer)

    @property
    def size(self) -> int:
        return len(self.spaced) + len(self.bare)

    def mapping(self, token_ids: set[int], rng: random.Random) -> dict[int, int]:
        """A one-to-one renaming of the name tokens among ``token_ids``."""
        out: dict[int, int] = {}
        for pool, members in ((self.spaced, self._spaced_set), (self.bare, self._bare_set)):
            present = sorted(t for t in token_ids if t in members)
            out.update(zip(present, rng.sample(pool, len(present)), strict=True))
        return out

    def __call__(self, trajectory: Trajectory, rng: random.Random) -> Trajectory:
        tokens = set(trajectory.prompt_ids) | {t for s in trajectory.segments for t in s.token_ids}
        m = self.mapping(tokens, rng)
        segments = [
            dataclasses.replace(s, token_ids=[m.get(t, t) for t in s.token_ids]) for s in trajectory.segments
        ]
        return dataclasses.replace(
            trajectory, prompt_ids=[m.get(t, t) for t in trajectory.prompt_ids], segments=segments
        )

    def sample(self, sample: Sample, rng: random.Random) -> Sample:
        """A training sample (prompt and completion ids) renamed the same way; its loss mask, group and
        advantage stay: a consistently renamed episode earns the same reward."""
        m = self.mapping(set(sample.prompt_ids) | set(sample.completion_ids), rng)
        return dataclasses.replace(
            sample,
            prompt_ids=[m.get(t, t) for t in sample.prompt_ids],
            completion_ids=[m.get(t, t) for t in sample.completion_ids],
        )


def _world_json(config: Any, option: str) -> str:
    """A run's world.json: ``train.sft.world``, else the one next to ``train.data.train``; ``option``
    (the setting that needs it) names the error."""
    world_json = config.sft.world or (
        str(Path(config.data.train).parent / "world.json") if config.data.train else None
    )
    if world_json is None:
        raise RagrlError(f"{option} needs the world's names: set train.sft.world (or train.data.train)")
    if not Path(world_json).is_file():
        raise RagrlError(
            f"{option} needs the world's names: world.json {world_json} not found (set train.sft.world)"
        )
    return world_json


class WorldRenaming:
    """The world's name words, for rollouts played in a consistently renamed copy of the world
    (``train.grpo.rename_world``).

    ``NameSwap`` renames what reaches an update after the fact; this renames the world *before* the
    policy plays it: each step draws a permutation of all of the world's name words (``draw``), and the
    step's questions, gold answers and every passage a search returns are read through it
    (``Renaming``, ``RenamedRetriever``). A training question's facts are then new at every step, so
    a rollout can only earn its reward by searching and reading, never by recalling the training
    answers; the held-out questions are played in the world as it is."""

    def __init__(self, words: set[str] | list[str], *, source: str = "the world") -> None:
        self.words = sorted(words)
        if len(self.words) < 2:
            raise RagrlError(f"rename_world: {source} has {len(self.words)} name words, too few to rename")
        # longest first, whole words only: "Brenim" is renamed in "Brenim's" but not inside "Brenimar"
        alternatives = "|".join(re.escape(w) for w in sorted(self.words, key=lambda w: (-len(w), w)))
        self.pattern = re.compile(rf"(?<!\w)(?:{alternatives})(?!\w)")

    @classmethod
    def for_run(cls, config: Any, option: str) -> WorldRenaming:
        """The renaming of a run's world (``train.sft.world``, else next to ``train.data.train``)."""
        world_json = _world_json(config, option)
        return cls(name_words(world_json), source=world_json)

    def draw(self, rng: random.Random) -> Renaming:
        """A random one-to-one renaming of every name word."""
        shuffled = list(self.words)
        rng.shuffle(shuffled)
        return Renaming(self.pattern, dict(zip(self.words, shuffled, strict=True)))


@dataclasses.dataclass(frozen=True)
class Renaming:
    """One permutation of the world's name words, applied to text (``forward``) and undone
    (``backward``: a query written in the renamed world, read in the real one)."""

    pattern: re.Pattern[str]
    mapping: dict[str, str]

    @functools.cached_property
    def digest(self) -> str:
        """A short hash of the permutation (what a retriever's fingerprint adds for it)."""
        return hashlib.sha256(json.dumps(sorted(self.mapping.items())).encode()).hexdigest()[:12]

    @functools.cached_property
    def inverse(self) -> dict[str, str]:
        return {v: k for k, v in self.mapping.items()}

    def forward(self, text: str) -> str:
        return self.pattern.sub(lambda m: self.mapping[m.group(0)], text)

    def backward(self, text: str) -> str:
        return self.pattern.sub(lambda m: self.inverse[m.group(0)], text)

    def passage(self, p: Passage) -> Passage:
        return Passage(p.id, self.forward(p.title), self.forward(p.text))

    def example(self, ex: Example) -> Example:
        """The question as it reads in the renamed world: question, gold answers, given passages and
        decomposition renamed; ids, supporting ids and metadata kept."""
        return dataclasses.replace(
            ex,
            question=self.forward(ex.question),
            answers=[self.forward(a) for a in ex.answers],
            passages=None if ex.passages is None else [self.passage(p) for p in ex.passages],
            decomposition=None
            if ex.decomposition is None
            else [
                dataclasses.replace(
                    s, question=self.forward(s.question), answers=tuple(self.forward(a) for a in s.answers)
                )
                for s in ex.decomposition
            ],
        )


class RenamedRetriever:
    """A retriever seen from inside a renamed world: each query is read back into the real world's
    names, searched, and its passages renamed (the same hits, ids and scores as the real search of
    the real query). With ``renaming`` None it is the retriever itself."""

    def __init__(self, base: Any) -> None:
        self.base = base
        self.renaming: Renaming | None = None

    @property
    def fingerprint(self) -> str:
        r = self.renaming
        return self.base.fingerprint if r is None else f"{self.base.fingerprint}+renamed-{r.digest}"

    @contextlib.contextmanager
    def playing(self, renaming: Renaming) -> Iterator[None]:
        """Searches inside ``renaming``'s world for the ``with`` block only."""
        self.renaming = renaming
        try:
            yield
        finally:
            self.renaming = None

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        r = self.renaming
        if r is None:
            return self.base.search(queries, k)
        found = self.base.search([r.backward(q) for q in queries], k)
        return [[Hit(r.passage(h.passage), h.score) for h in hits] for hits in found]

    def save(self, directory: str | Path) -> None:
        self.base.save(directory)
