"""R²AG's steering grammar and settings: the prompt, the parser, the typed record of a step, and the
rollout settings (``ragrl.methods.r2ag`` is the method; the rules below are its §1.2).

Parse rules (``parse_steering``; one generated step, never the prompt):

* ``<think>``: the first complete ``<think>…</think>`` span; query tags inside a think block are ignored;
* queries: every complete ``<base-Q>`` and ``<predicted-Q>`` span outside the think blocks, in written
  order, whitespace collapsed; an empty one is skipped (and counted);
* sentinels (case-insensitive, surrounding quotes and final punctuation ignored): ``stop retrieval`` in a
  ``<base-Q>`` is the stop signal, ``none`` in a ``<predicted-Q>`` means no prediction; neither is a query;
* an output with no query and no stop is ``invalid``.

In the trajectory a step's record is typed (``step_actions``): ``think`` (its text), one ``search`` action
per query that was retrieved (``Action.tag`` = ``base-Q`` or ``predicted-Q``, top-k ids in
``retrieved_ids``), ``pruned`` for a query Top-Survivor did not keep (evaluation only), ``stop``, or
``invalid``. The reward (``ragrl.methods.r2ag.rewards``) reads these actions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ragrl.data.schema import Example
from ragrl.errors import DataError, RagrlError
from ragrl.retrieval.base import Hit
from ragrl.rollout.config import RolloutConfig
from ragrl.rollout.protocol import Protocol, find_spans, squash_ws
from ragrl.rollout.trajectory import Action, Segment, Trajectory

BASE, PREDICTED = "base-Q", "predicted-Q"
STOP_SENTINEL, NONE_SENTINEL = "stop retrieval", "none"
SCRIPTED_THOUGHTS = (
    "Next I need these facts.",
    "The evidence answers the question.",
    "I search for the question itself.",
)
"""What the scripted steerers (``ragrl.methods.r2ag.steering``) think: words a tiny tokenizer must know."""
CONTEXT_KEY = "r2ag_context"
"""``Example.metadata`` key of a tree state's context d̃: the passages found so far (``{id, title, text}``)."""

DEFAULT_USER = (
    "Split the question below into single-hop sub-questions a search engine can answer, using the "
    "evidence found so far.\n"
    "1. Base questions: the sub-question(s) of the next hop, each inside its own <base-Q> and </base-Q>. "
    "Each asks for one fact (who, when, where, ...); do not ask again what the evidence already answers. "
    "If the evidence already answers the question, write <base-Q> stop retrieval </base-Q>.\n"
    "2. Predicted questions: if you already know the answer to a base question, write the question of "
    "the hop after it inside <predicted-Q> and </predicted-Q>; otherwise write "
    "<predicted-Q> none </predicted-Q>.\n"
    "Think briefly inside <think> and </think> first.\n"
    "Question: {question}\n"
    "Evidence:\n{evidence}"
)


@dataclass
class R2agProtocolConfig:
    system: str | None = None
    user: str = DEFAULT_USER
    """The steering prompt (our wording of the paper's ``#Decomposition#``); fields ``{question}`` and
    ``{evidence}`` (the rendered context documents)."""
    doc_template: str = "[{index}] {title}: {text}"
    doc_separator: str = "\n"
    no_evidence: str = "(none yet)"
    reader_user: str = (
        "Answer the question from the documents. Give only the answer between <answer> and </answer>.\n"
        "Documents:\n{evidence}\nQuestion: {question}"
    )
    """The generator's prompt (QA on the retrieved set, ``rollout.read``); fields ``{question}`` and
    ``{evidence}`` (every document the tree retrieved, in retrieval order)."""


@dataclass(frozen=True)
class Steering:
    """What one steering step wrote (``parse_steering``)."""

    think: str | None
    base: tuple[str, ...]
    predicted: tuple[str, ...]
    stop: bool
    empty_queries: int = 0
    """Query tags with nothing in them (skipped)."""

    @property
    def queries(self) -> list[tuple[str, str]]:
        """Every candidate query in written order within its kind: base ones first, then predicted."""
        return [(BASE, q) for q in self.base] + [(PREDICTED, q) for q in self.predicted]

    @property
    def valid(self) -> bool:
        return self.stop or bool(self.base) or bool(self.predicted)


def _sentinel(text: str) -> str:
    return squash_ws(text).strip("\"'`").rstrip(".!").strip().lower()


def parse_steering(text: str) -> Steering:
    """Read one steering output (module docstring: the parse rules)."""
    thinks = find_spans(text, "think")
    inside = [(s.start, s.end) for s in thinks]

    def outside(span: Any) -> bool:
        return not any(a <= span.start < b for a, b in inside)

    base: list[str] = []
    predicted: list[str] = []
    stop, empty = False, 0
    spans = sorted(
        (s for tag in (BASE, PREDICTED) for s in find_spans(text, tag) if outside(s)), key=lambda s: s.start
    )
    for span in spans:
        content = squash_ws(span.content)
        if not content:
            empty += 1
        elif span.tag == BASE and _sentinel(content) == STOP_SENTINEL:
            stop = True
        elif span.tag == PREDICTED and _sentinel(content) == NONE_SENTINEL:
            continue
        else:
            (base if span.tag == BASE else predicted).append(content)
    think = squash_ws(thinks[0].content) if thinks else None
    return Steering(think, tuple(base), tuple(predicted), stop, empty)


def format_segments(text: str) -> int:
    """Query-tag segments (sentinels included) written after the first complete ``<think>`` block: what
    the format reward counts."""
    thinks = find_spans(text, "think")
    if not thinks:
        return 0
    end = thinks[0].end
    return sum(1 for tag in (BASE, PREDICTED) for s in find_spans(text, tag) if s.start >= end)


def context_passages(example: Example) -> list[dict[str, str]]:
    """A tree state's context d̃ (empty at the root)."""
    return list(example.metadata.get(CONTEXT_KEY) or [])


class R2agProtocol(Protocol):
    """The steering prompt and grammar. A steering step is one generation (EOS or the token budget ends
    it); the documents its queries retrieve become the next step's context, never part of its output."""

    name = "r2ag"
    stop = ()

    def __init__(self, config: R2agProtocolConfig | None = None) -> None:
        self.shots: list[tuple[Example, str]] = []
        """Worked steps shown before every prompt (R²AG-p's few-shot prompting; ``with_shots``)."""
        self.config = c = config or R2agProtocolConfig()
        for key, template in (
            ("protocol.user", c.user),
            ("protocol.system", c.system or ""),
            ("protocol.reader_user", c.reader_user),
        ):
            try:
                template.format(question="q", evidence="e")
            except (KeyError, IndexError, ValueError) as e:
                raise RagrlError(
                    f"{key}: bad template ({type(e).__name__}: {e}); its fields are {{question}} and "
                    "{evidence}"
                ) from None

    def evidence(self, passages: Sequence[Any]) -> str:
        """The documents as the prompt shows them (``{id, title, text}`` records or ``Passage``s)."""
        c = self.config
        if not passages:
            return c.no_evidence
        rows = []
        for i, p in enumerate(passages, 1):
            title, text = (p["title"], p["text"]) if isinstance(p, dict) else (p.title, p.text)
            rows.append(c.doc_template.format(index=i, title=title, text=text))
        return c.doc_separator.join(rows)

    def messages(self, example: Example, context: Sequence[Any] | None = None) -> list[dict[str, str]]:
        """The steering prompt for ``example`` with ``context`` (default: the state's own context)."""
        c = self.config
        docs = self.evidence(context_passages(example) if context is None else context)
        out = []
        if c.system:
            out.append(
                {"role": "system", "content": c.system.format(question=example.question, evidence=docs)}
            )
        for state, reply in self.shots:
            shown = self.evidence(context_passages(state))
            out.append(
                {"role": "user", "content": c.user.format(question=state.question.strip(), evidence=shown)}
            )
            out.append({"role": "assistant", "content": reply})
        out.append(
            {"role": "user", "content": c.user.format(question=example.question.strip(), evidence=docs)}
        )
        return out

    def with_shots(self, shots: Sequence[tuple[Example, str]]) -> R2agProtocol:
        """This protocol with worked steps in front of every prompt: each a tree state (its question and
        context) and the steering text written for it (``ragrl.methods.r2ag.steering.oracle_shots``)."""
        out = R2agProtocol(self.config)
        out.shots = list(shots)
        return out

    def reader_messages(self, example: Example, passages: Sequence[Any]) -> list[dict[str, str]]:
        evidence = self.evidence(passages)
        return [
            {
                "role": "user",
                "content": self.config.reader_user.format(
                    question=example.question.strip(), evidence=evidence
                ),
            }
        ]

    def parse(self, text: str, turn: int) -> Action:
        """A summary action of one step (the rollout records the full step from ``parse_steering``)."""
        s = parse_steering(text if isinstance(text, str) else "")
        if not s.valid:
            return Action("invalid", turn=turn, error="no <base-Q> or <predicted-Q> query and no stop")
        if s.stop:
            return Action("stop", content=STOP_SENTINEL, turn=turn)
        kind, query = s.queries[0]
        return Action("search", content=query, turn=turn, tag=kind)

    def replay(self, record: dict[str, Any], path: Any, line: int, *, fallback: bool = False) -> Trajectory:
        """One recorded steering step: ``{id, completion, retrieved, context?, truncated?}`` with
        ``retrieved`` mapping each query of the completion to the doc ids it retrieved (rank order; a
        single id is a list of one), ``context`` the ids found before the step (r̃^j), ``truncated`` true
        when the output was cut by the token budget. R²AG's steps have no answer to fall back on
        (``fallback`` is ignored)."""
        text = record["completion"]
        retrieved, context = record.get("retrieved", {}), record.get("context", [])
        if not isinstance(retrieved, dict):
            raise DataError(
                "must be an object mapping each query to its doc ids", path=path, line=line, field="retrieved"
            )
        if not isinstance(context, list) or not all(isinstance(x, str) for x in context):
            raise DataError("must be a list of doc ids", path=path, line=line, field="context")
        steering = parse_steering(text)
        found: list[list[str] | None] = []
        for _, query in steering.queries:
            if query not in retrieved:
                raise DataError(
                    f"no doc ids for the query {query!r}", path=path, line=line, field="retrieved"
                )
            ids = retrieved[query]
            ids = [ids] if isinstance(ids, str) else ids
            if not isinstance(ids, list) or not all(isinstance(x, str) for x in ids):
                raise DataError(
                    f"the ids of {query!r} must be a list of strings", path=path, line=line, field="retrieved"
                )
            found.append(ids)
        truncated = record.get("truncated", False)
        if not isinstance(truncated, bool):
            raise DataError("must be true or false", path=path, line=line, field="truncated")
        finish = "length" if truncated else "eos"
        traj = Trajectory(
            str(record["id"]), [], metadata={"prior_ids": list(context), "replayed_from_text": True}
        )
        traj.segments.append(Segment("policy", [], text, [], finish_reason=finish))
        traj.actions.extend(step_actions(steering, 0, found))
        traj.metadata["steering_steps"] = 1
        return traj

    def observation(self, action: Action, hits: list[Hit]) -> str:
        return ""  # retrieved documents go into the next step's prompt, never after the output

    def corrective(self, action: Action) -> str:
        return ""

    def env_spans(self, text: str) -> list[tuple[int, int]]:
        return []

    def fixed_texts(self) -> list[str]:
        c = self.config
        return [c.user, c.reader_user, c.no_evidence, STOP_SENTINEL, NONE_SENTINEL, *SCRIPTED_THOUGHTS]


# --- the step records of a trajectory ----------------------------------------------------------------


def step_actions(steering: Steering, turn: int, retrieved: Sequence[list[str] | None]) -> list[Action]:
    """The typed record of one step: ``think``, one ``search`` per retrieved query (``pruned`` where
    ``retrieved`` is None: Top-Survivor did not keep it), then ``stop`` (or ``invalid``). ``retrieved``
    follows ``steering.queries`` (base queries in written order, then predicted ones)."""
    out = []
    if steering.think is not None:
        out.append(Action("think", content=steering.think, turn=turn))
    if not steering.valid:
        return [*out, Action("invalid", turn=turn, error="no <base-Q> or <predicted-Q> query and no stop")]
    for (tag, query), ids in zip(steering.queries, retrieved, strict=True):
        if ids is None:
            out.append(Action("pruned", content=query, turn=turn, tag=tag))
        else:
            out.append(Action("search", content=query, turn=turn, tag=tag, retrieved_ids=list(ids)))
    if steering.stop:
        out.append(Action("stop", content=STOP_SENTINEL, turn=turn))
    return out


@dataclass
class StepRecord:
    """One steering step of a trajectory, read from its typed actions."""

    think: bool
    base_hits: list[str | None]
    """The top-1 document of each base candidate, in written order (None: not retrieved or nothing found)."""
    pred_hits: list[str | None]
    stop: bool
    retrieved: list[str]
    """Every document this step retrieved (all ranks), in order."""
    truncated: bool


def step_records(trajectory: Trajectory) -> list[StepRecord]:
    """The steering steps of ``trajectory`` (one per policy segment that is not the reader's answer)."""
    policy = [s for s in trajectory.segments if s.kind == "policy"]
    steps = int(trajectory.metadata.get("steering_steps", len(policy)))
    out = []
    for t in range(steps):
        acts = [a for a in trajectory.actions if a.turn == t]
        queries = [a for a in acts if a.kind in ("search", "pruned")]

        def tops(tag: str, queries: list[Action] = queries) -> list[str | None]:
            return [
                (a.retrieved_ids[0] if a.kind == "search" and a.retrieved_ids else None)
                for a in queries
                if a.tag == tag
            ]

        out.append(
            StepRecord(
                think=any(a.kind == "think" for a in acts),
                base_hits=tops(BASE),
                pred_hits=tops(PREDICTED),
                stop=any(a.kind == "stop" for a in acts),
                retrieved=[i for a in queries if a.kind == "search" for i in a.retrieved_ids],
                truncated=t < len(policy) and policy[t].finish_reason == "length",
            )
        )
    return out


def prior_ids(trajectory: Trajectory, example: Example) -> list[str]:
    """The documents found before the trajectory's first step: what the rollout recorded
    (``metadata["prior_ids"]``), else the state's context."""
    recorded = trajectory.metadata.get("prior_ids")
    return list(recorded) if recorded is not None else [p["id"] for p in context_passages(example)]


@dataclass
class R2agRolloutConfig(RolloutConfig):
    """The rollout settings of R²AG (``rollout.kind: r2ag``, ``ragrl.methods.r2ag.rollout``). ``grow: step``
    (training) plays one expansion of each tree state, ``n`` samples of it (one group per (tree, step)),
    every candidate retrieved at top-``train_k``; ``grow: tree`` (evaluation, ``for_evaluation``) grows
    whole trees, up to ``max_iterations`` steps, keeping the Top-Survivor queries at top-``k``."""

    kind: str = "r2ag"
    k: int = 1
    """Documents per query at evaluation (1 or 2: "@top-1" / "@top-2")."""
    train_k: int = 1
    """Documents per query in training (the paper's top-1)."""
    grow: str = "step"
    """``step``: one expansion of each given tree state (training; the RR-Forest rounds carry the trees
    on); ``tree``: whole trees (evaluation)."""
    max_iterations: int = 5
    """L_MAX-I: the most steering steps of a tree, and (unless ``rounds`` says otherwise) the most
    RR-Forest rounds in training."""
    rounds: int | None = None
    """RR-Forest rounds in training (None: ``max_iterations``, the paper's L_MAX-I); 1 trains on root
    states only (the ablation without self-evolution)."""
    top_t: int | None = None
    """Top-Survivor at evaluation: the first t base queries of a step are retrieved (None: every one).
    The paper's t = M/2 (M = the dataset's most hops) by default, t = M as the option."""
    top_t_pred: int | None = None
    """The first t_p predicted queries retrieved at evaluation (None: as many as ``top_t``)."""
    use_pred: bool = True
    """Retrieve predicted queries (R²AG); False is R²AG_base."""
    read: bool = False
    """After the tree: the policy answers from the retrieved documents (the generator; QA metrics)."""
    reader_max_new_tokens: int = 32
    survivors_in_training: bool = False
    """Apply Top-Survivor in training too (the paper retrieves every candidate and scores the first t)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.grow not in ("step", "tree"):
            raise RagrlError(f"rollout.grow must be step or tree, got {self.grow!r}")
        for name in ("train_k", "max_iterations", "reader_max_new_tokens"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise RagrlError(f"rollout.{name} must be a positive integer, got {v!r}")
        for name in ("top_t", "top_t_pred", "rounds"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise RagrlError(f"rollout.{name} must be a positive integer or null, got {v!r}")

    def for_evaluation(self) -> R2agRolloutConfig:
        """Whole trees: up to ``max_iterations`` steps, Top-Survivor, top-``k`` per query."""
        return dataclasses.replace(self, grow="tree")
