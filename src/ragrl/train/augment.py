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

import dataclasses
import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

from ragrl.data.io import read_text
from ragrl.errors import RagrlError
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
        world_json = config.sft.world or (
            str(Path(config.data.train).parent / "world.json") if config.data.train else None
        )
        if world_json is None:
            raise RagrlError(f"{option} needs the world's names: set train.sft.world (or train.data.train)")
        if not Path(world_json).is_file():
            raise RagrlError(
                f"{option} needs the world's names: world.json {world_json} not found (set train.sft.world)"
            )
        return cls.from_world(world_json, tokenizer)

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
