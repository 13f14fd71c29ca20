"""The rollout's settings (a method config's ``rollout:`` section, ``RolloutConfig``): samples, sampling, turn
and token limits and the protocol's fallbacks. What the engine does with them is in
``ragrl.rollout.engine``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ragrl.errors import RagrlError
from ragrl.llm.backend import SamplingParams
from ragrl.rollout.limits import LONG_QUESTION_MODES
from ragrl.rollout.registry import ROLLOUTS

FINISH_REASONS = ("answer", "eos", "max_turns", "max_tokens", "invalid_limit")


INVALID_FALLBACKS = ("corrective", "answer")


@dataclass
class RolloutConfig:
    kind: str = "multi_turn"
    """The rollout (``ragrl.rollout.registry``) a method plays: ``multi_turn`` is this engine."""
    max_turns: int = 4
    """Policy turns per episode (not counting the optional final answer-only turn)."""
    max_total_tokens: int = 1024
    """Completion budget: policy and observation tokens together (the prompt is not counted)."""
    max_new_tokens: int = 128
    """Tokens per policy turn (shrinks to the remaining ``max_total_tokens``)."""
    max_obs_tokens: int = 400
    """Tokens per observation; longer ones are cut (``Segment.truncated``)."""
    k: int = 3
    """Passages retrieved per search query."""
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    """Default seed of ``run`` (each turn's generate call gets a seed derived from it and the turn)."""
    n: int = 1
    """Samples per example (the GRPO group size)."""
    greedy_samples: int = 0
    """The first this many samples of each example decode greedily (temperature 0), the others sample
    at ``temperature``: a GRPO group then weighs the policy's greedy episode against its samples
    (``metadata["greedy"]``). 0: every sample samples."""
    max_invalid: int | None = None
    """End the episode after this many invalid actions (None: only the turn limit applies)."""
    resample_invalid: int = 0
    """Sample an invalid action's turn again, up to this many times, before it counts (EVO-RAG §1.6;
    not at temperature 0, where a resample repeats itself). Each discarded generation is kept in the
    trajectory's ``metadata["resampled"]`` (turn, text, error). 0: an invalid action counts at once."""
    invalid_fallback: str = "corrective"
    """What an action that is still invalid gets: ``corrective`` (the protocol's corrective message; the
    step is spent) or ``answer`` (its text after any thinking block is taken as the final answer,
    ``Protocol.fallback_answer``; the turn is listed in ``metadata["fallback_answers"]``)."""
    final_answer_turn: bool = False
    """After ``max_turns``, give unfinished episodes one more turn whose searches are not executed
    (the Search-R1 / Eval-RAR code lineage); off by default."""
    max_question_chars: int = 2000
    """Longer questions are cut or refused (``long_questions``) when a question set is prepared."""
    long_questions: str = "truncate"
    """``truncate`` (cut to ``max_question_chars``, counted and reported) or ``reject`` (an error)."""
    max_prompt_tokens: int = 8192
    """An episode whose prompt encodes to more tokens is refused with an error naming the question."""

    @property
    def answers_invalid(self) -> bool:
        """``invalid_fallback: answer``: a turn the protocol cannot read is taken as the answer."""
        return self.invalid_fallback == "answer"

    def __post_init__(self) -> None:
        ROLLOUTS.get(self.kind, key="rollout.kind")
        limits = ("max_question_chars", "max_prompt_tokens")
        for name in ("max_turns", "max_total_tokens", "max_new_tokens", "max_obs_tokens", "k", "n", *limits):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise RagrlError(f"rollout.{name} must be a positive integer, got {v!r}")
        if self.long_questions not in LONG_QUESTION_MODES:
            raise RagrlError(
                f"rollout.long_questions must be one of {', '.join(LONG_QUESTION_MODES)}, "
                f"got {self.long_questions!r}"
            )
        if not isinstance(self.greedy_samples, int) or self.greedy_samples < 0:
            raise RagrlError(f"rollout.greedy_samples must be >= 0, got {self.greedy_samples!r}")
        if not isinstance(self.resample_invalid, int) or self.resample_invalid < 0:
            raise RagrlError(f"rollout.resample_invalid must be >= 0, got {self.resample_invalid!r}")
        if self.invalid_fallback not in INVALID_FALLBACKS:
            raise RagrlError(
                f"rollout.invalid_fallback must be one of {', '.join(INVALID_FALLBACKS)}, "
                f"got {self.invalid_fallback!r}"
            )
        if self.max_invalid is not None and self.max_invalid < 1:
            raise RagrlError(f"rollout.max_invalid must be >= 1 or null, got {self.max_invalid!r}")
        # validates temperature / top_p / top_k with the backend's own rules
        try:
            self.sampling(1)
        except ValueError as e:
            raise RagrlError(f"rollout: {e}") from None

    def sampling(
        self,
        max_new_tokens: int,
        stop: tuple[str, ...] = (),
        seed: int | None = None,
        seeds: tuple[int, ...] | None = None,
    ) -> SamplingParams:
        return SamplingParams(
            max_new_tokens=max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            stop=tuple(stop),
            seed=seed,
            seeds=seeds,
        )
