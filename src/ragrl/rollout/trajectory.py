"""``Trajectory``: the typed record of one rollout, read by rewards, advantages, evaluation and reports.

A trajectory is the prompt's token ids plus an ordered list of segments. A *policy* segment holds the
tokens the model generated in one turn, exactly as generated, with their log-probs; an *env* segment
holds an observation (retrieved passages, a corrective message) tokenized once and appended. Everything
the training code needs is derived from the segments, never stored twice:

* ``completion_ids``: all segment tokens concatenated, in order;
* ``loss_mask``: 1 for policy tokens, 0 for environment tokens (same length as ``completion_ids``);
* ``completion_logprobs``: the policy log-probs aligned with ``completion_ids`` (0.0 under env tokens).

``actions`` are the parsed actions, one per policy turn, carrying the queries, the retrieved passage
ids and scores of a search, and the answer text; ``final_answer`` is the answer the episode ended with
(None if it ended without one). Serialised as one JSON object per line (``to_dict`` / ``from_dict``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

SegmentKind = Literal["policy", "env"]

# Action kinds used across methods. A protocol may add its own; these names are shared vocabulary.
ACTION_KINDS = ("search", "answer", "evaluate", "reflect", "backtrack", "refuse", "think", "invalid")


@dataclass
class Segment:
    kind: SegmentKind
    token_ids: list[int]
    text: str
    """Policy: the decoding of ``token_ids``. Env: the observation text that was tokenized."""
    logprobs: list[float] | None = None
    """Policy only: one log-prob per token (see ``ragrl.llm.backend`` for the convention)."""
    finish_reason: str | None = None
    """Policy only: why the backend stopped this turn ("stop", "eos", "length")."""
    truncated: bool = False
    """Env only: the observation was cut (``max_obs_tokens`` or the total token budget)."""

    def __post_init__(self) -> None:
        if self.kind not in ("policy", "env"):
            raise ValueError(f"segment kind must be 'policy' or 'env', got {self.kind!r}")
        if self.kind == "policy" and self.logprobs is not None and len(self.logprobs) != len(self.token_ids):
            raise ValueError("a policy segment needs one log-prob per token")
        if self.kind == "env" and self.logprobs is not None:
            raise ValueError("an env segment has no log-probs")


@dataclass
class Action:
    kind: str
    """One of ``ACTION_KINDS`` (or a protocol's own kind)."""
    content: str = ""
    """The query of a search, the answer text of an answer, the body of an evaluate/reflect block."""
    turn: int = 0
    """The step (policy turn, counted from 0) this action was parsed in. A protocol with follow-up
    generations (``Protocol.followup_stop``) records two actions in a search step: the search and
    the follow-up."""
    retrieved_ids: list[str] = field(default_factory=list)
    retrieved_scores: list[float] = field(default_factory=list)
    retrieved_titles: list[str] = field(default_factory=list)
    """The titles of the retrieved passages (for per-step logs), aligned with ``retrieved_ids``."""
    error: str | None = None
    """For ``invalid``: what was wrong (shown to the policy in the corrective observation)."""
    tag: str = ""
    """The tag the action was written in, where a protocol has several for one kind (R²AG's searches:
    ``base-Q`` or ``predicted-Q``); empty otherwise."""


@dataclass
class Trajectory:
    example_id: str
    prompt_ids: list[int]
    segments: list[Segment] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)
    final_answer: str | None = None
    finish_reason: str = ""
    """Why the episode ended: "answer", "eos", "max_turns", "max_tokens", ..."""
    truncated: bool = False
    """True when the episode was cut by a budget (turns or tokens) rather than ending by itself."""
    timings: dict[str, float] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)

    # -- derived views (never stored) -------------------------------------------------------------
    @property
    def completion_ids(self) -> list[int]:
        return [t for s in self.segments for t in s.token_ids]

    @property
    def loss_mask(self) -> list[int]:
        return [1 if s.kind == "policy" else 0 for s in self.segments for _ in s.token_ids]

    @property
    def completion_logprobs(self) -> list[float]:
        out: list[float] = []
        for s in self.segments:
            if s.kind == "policy" and s.logprobs is not None:
                out.extend(s.logprobs)
            else:
                out.extend([0.0] * len(s.token_ids))
        return out

    @property
    def completion_text(self) -> str:
        """The generated text after the prompt, observations included."""
        return "".join(s.text for s in self.segments)

    @property
    def policy_text(self) -> str:
        """Only what the policy wrote."""
        return "".join(s.text for s in self.segments if s.kind == "policy")

    @property
    def num_policy_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.segments if s.kind == "policy")

    @property
    def answers(self) -> list[str]:
        """Every answer given, in order (more than one after a reflection pass; the last is final)."""
        return [a.content for a in self.actions if a.kind == "answer"]

    @property
    def queries(self) -> list[str]:
        return [a.content for a in self.actions if a.kind == "search"]

    @property
    def retrieved_ids(self) -> list[str]:
        """Every retrieved passage id, in retrieval order (repeats kept)."""
        return [pid for a in self.actions if a.kind == "search" for pid in a.retrieved_ids]

    @property
    def num_searches(self) -> int:
        return sum(1 for a in self.actions if a.kind == "search")

    @property
    def num_invalid(self) -> int:
        return sum(1 for a in self.actions if a.kind == "invalid")

    # -- serialisation ------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trajectory:
        """The inverse of ``to_dict``; a malformed record raises ``TypeError`` or ``ValueError`` whose
        message names the field (repr-quoted, so it stays on one line)."""
        d = dict(d)
        d["segments"] = [_build(Segment, s, f"segments[{i}]") for i, s in enumerate(_list(d, "segments"))]
        d["actions"] = [_build(Action, a, f"actions[{i}]") for i, a in enumerate(_list(d, "actions"))]
        return _build(cls, d, "trajectory")


def _list(d: dict[str, Any], key: str) -> list[Any]:
    value = d.get(key, [])
    if not isinstance(value, list):
        raise TypeError(f"{key}: expected a list, got {type(value).__name__}")
    return value


def _build(cls: type, record: Any, where: str) -> Any:
    """``cls(**record)`` for a dataclass, refusing what is not an object and any unknown field."""
    if not isinstance(record, dict):
        raise TypeError(f"{where}: expected an object, got {type(record).__name__}")
    unknown = [k for k in record if k not in cls.__dataclass_fields__]
    if unknown:
        raise TypeError(f"{where}: unknown field {unknown[0]!r}")
    return cls(**record)
