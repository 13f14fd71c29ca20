"""Input limits: a question longer than ``rollout.max_question_chars`` is cut or refused before any
rollout sees it, and a prompt longer than ``rollout.max_prompt_tokens`` is refused when the episode
starts. Without them a 1 MB question keeps a whole evaluation busy for minutes and reads as an
ordinary ``max_turns`` failure.

``rollout.long_questions`` chooses: ``truncate`` (the default) keeps the first ``max_question_chars``
characters, marks the example (``metadata.question_chars``: the original length) and reports the
count; ``reject`` stops with an error naming the question and where it came from."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from ragrl.data.schema import Example
from ragrl.errors import RagrlError

LONG_QUESTION_MODES = ("truncate", "reject")


@dataclasses.dataclass(frozen=True)
class LimitReport:
    """What ``limit_questions`` did: the ids of the questions it cut, and the longest one's length."""

    cut: tuple[str, ...] = ()
    longest: int = 0

    def summary(self, where: str, limit: int) -> str:
        first = ", ".join(self.cut[:3]) + (", ..." if len(self.cut) > 3 else "")
        return (
            f"{where}: cut {len(self.cut)} question(s) to rollout.max_question_chars={limit:,} characters "
            f"(longest {self.longest:,}; first: {first})"
        )


def limit_questions(
    examples: Sequence[Example], config: Any, where: str
) -> tuple[list[Example], LimitReport]:
    """``examples`` with every question within ``config.max_question_chars`` (``config`` is a
    ``RolloutConfig``): cut, or an error, as ``config.long_questions`` says."""
    limit, mode = config.max_question_chars, config.long_questions
    out: list[Example] = []
    cut: list[str] = []
    longest = 0
    for ex in examples:
        size = len(ex.question)
        if size <= limit:
            out.append(ex)
            continue
        if mode == "reject":
            raise RagrlError(
                f"{where}: question {ex.id!r} has {size:,} characters, over rollout.max_question_chars="
                f"{limit:,} (--set rollout.long_questions=truncate cuts it instead)"
            )
        cut.append(ex.id)
        longest = max(longest, size)
        metadata = {**ex.metadata, "question_chars": size}
        out.append(dataclasses.replace(ex, question=ex.question[:limit], metadata=metadata))
    return out, LimitReport(tuple(cut), longest)


def check_prompts(
    examples: Sequence[Example], protocol: Any, tokenizer: Any, config: Any, where: str
) -> None:
    """Refuse a question set up front when any prompt is over ``config.max_prompt_tokens`` (training
    would otherwise stop at the step that samples it, evaluation after the chunks before it)."""
    for ex in examples:
        try:
            check_prompt_length(ex, protocol.prompt_ids(ex, tokenizer), config)
        except RagrlError as e:
            raise RagrlError(f"{where}: {e}") from None


def check_prompt_length(example: Example, prompt_ids: Sequence[int], config: Any) -> None:
    """Refuse an episode whose prompt is longer than ``config.max_prompt_tokens`` (a templated prompt has
    no safe place to cut: shorten the question or the given passages)."""
    if len(prompt_ids) > config.max_prompt_tokens:
        raise RagrlError(
            f"question {example.id!r}: its prompt is {len(prompt_ids):,} tokens, over "
            f"rollout.max_prompt_tokens={config.max_prompt_tokens:,} (shorten the question or its given "
            "passages, or raise the limit)"
        )
