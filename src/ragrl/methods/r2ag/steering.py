"""Scripted steering for R²AG: the gold-decomposition oracle (the upper bound, and the SFT warm start's
demonstrator) and single-step retrieval (SR@N), played through the real rollout (``SteererBackend``):
the same parse, retrieval, tree and metrics as a model."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

from ragrl.data.schema import Example
from ragrl.errors import RagrlError
from ragrl.llm.backend import Generation, SamplingParams
from ragrl.methods.r2ag.protocol import CONTEXT_KEY, NONE_SENTINEL, SCRIPTED_THOUGHTS, STOP_SENTINEL, Steering
from ragrl.methods.r2ag.tree import RRT, TREE_KEY, split_steps
from ragrl.rollout.protocol import squash_ws
from ragrl.rollout.scripted import scripted_generation
from ragrl.rollout.trajectory import Segment, Trajectory


def steering_text(
    base: Sequence[str], predicted: Sequence[str] = (), *, stop: bool = False, think: str = ""
) -> str:
    """A steering output in the protocol's grammar (what the scripted steerers write)."""
    parts = [f"<think> {think or SCRIPTED_THOUGHTS[0]} </think>"]
    parts += [f"<base-Q> {q} </base-Q>" for q in base]
    if stop:
        parts.append(f"<base-Q> {STOP_SENTINEL} </base-Q>")
    parts += [f"<predicted-Q> {q} </predicted-Q>" for q in predicted] or [
        f"<predicted-Q> {NONE_SENTINEL} </predicted-Q>"
    ]
    return "\n".join(parts)


_STEP_REF = re.compile(r"#(\d+)")


class SteeringOracle:
    """The upper bound that follows the gold decomposition (MuSiQue's, the synthetic world's). At each
    step it asks every sub-question that is not done (asked in an earlier step of its tree, or its gold
    passages already in the context: a state of the RR-Forest) and whose dependencies are done (a
    sub-question depends on step k when it says ``#k`` or names step k's gold answer), with the gold
    answers filled in; when every sub-question is done it writes ``stop retrieval``. Without a
    decomposition (HotpotQA, 2Wiki) it asks for the title of the first supporting passage not asked for
    and not in the context, one a step (each hop, in the supporting facts' order). It predicts nothing."""

    name = "oracle"

    def steer(self, example: Example, context: list[dict[str, str]], history: list[Steering]) -> str:
        asked = {q for s in history for q in s.base}
        have = {d["id"] for d in context}
        steps = example.decomposition or []
        if not steps:
            from ragrl.synth.demonstrators import supporting_titles

            found = {d["title"] for d in context if d["id"] in example.supporting_ids}
            titles = [t for t in supporting_titles(example) if t not in asked and t not in found]
            return steering_text(titles[:1], stop=not titles)
        answers = [s.answers[0] if s.answers else "" for s in steps]
        questions = [
            _STEP_REF.sub(
                lambda m: answers[int(m.group(1)) - 1] if 0 < int(m.group(1)) <= len(answers) else m.group(0),
                s.question,
            )
            for s in steps
        ]
        done = [
            q in asked or bool(st.supporting_ids and set(st.supporting_ids) <= have)
            for q, st in zip(questions, steps, strict=True)
        ]
        ready = []
        for j, q in enumerate(questions):
            if done[j]:
                continue
            deps = [
                k
                for k in range(j)
                if f"#{k + 1}" in steps[j].question or (answers[k] and answers[k] in steps[j].question)
            ]
            if all(done[k] for k in deps):
                ready.append(q)
        if not ready:
            return steering_text([], stop=True, think=SCRIPTED_THOUGHTS[1])
        return steering_text(ready)

    def play(self, method: Any, tokenizer: Any, examples: list[Example], retriever: Any) -> list[Trajectory]:
        """SFT demonstrations: the oracle's trees (greedy, whole), cut into one trajectory per step."""
        config = dataclasses.replace(method.eval_rollout or method.rollout, temperature=0.0, n=1)
        rollout = method.make_rollout(SteererBackend(tokenizer, self), retriever, config)
        return [step for tree in rollout.run(examples, n=1, seed=0) for step in split_steps(tree)]


def oracle_shots(
    method: Any,
    tokenizer: Any,
    pool: Sequence[Example],
    retriever: Any,
    *,
    max_docs: int = 2,
    chars: int = 300,
) -> list[tuple[Example, str]]:
    """Worked steps for few-shot steering (R²AG-p): the oracle's trees on ``pool`` questions, one shot of
    each kind the model must write, each from the first tree that has it: a first step (no evidence, the
    first hop asked), a later step (evidence found, the next hop asked) and a stop. A shot's context
    keeps the last ``max_docs`` documents found before the step, each cut to ``chars`` characters, to keep
    prompts short."""
    config = dataclasses.replace(method.eval_rollout or method.rollout, temperature=0.0, n=1)
    trees = method.make_rollout(SteererBackend(tokenizer, SteeringOracle()), retriever, config).run(
        list(pool), n=1
    )
    eos = tokenizer.eos_token or ""
    shots: dict[str, tuple[Example, str]] = {}
    for tree, example in zip(trees, pool, strict=True):
        vertices = RRT.from_records(example.question, tree.metadata.get(TREE_KEY) or []).vertices
        for t, step in enumerate(split_steps(tree)):
            kinds = {a.kind for a in step.actions}
            kind = "stop" if "stop" in kinds else "first" if t == 0 else "next"
            if kind in shots or (kind != "stop" and "search" not in kinds):
                continue
            found = {d["id"]: d for v in vertices if v.depth <= t for d in v.docs}
            context = [{**d, "text": d["text"][:chars]} for d in list(found.values())[-max_docs:]]
            state = dataclasses.replace(example, metadata={**example.metadata, CONTEXT_KEY: context})
            shots[kind] = (
                state,
                step.segments[0].text.replace(eos, "").strip() if eos else step.segments[0].text.strip(),
            )
    return [shots[k] for k in ("first", "next", "stop") if k in shots]


def few_shot(
    method: Any, tokenizer: Any, pool: Sequence[Example], retriever: Any, k: int
) -> tuple[Any, list[Trajectory]]:
    """``ragrl eval --few-shot`` for R²AG (R²AG-p): the method's protocol with the first ``k`` of
    ``oracle_shots`` on the pool (at most 3: a first step, a later one, a stop), and each shot as a
    one-step trajectory (``shots.jsonl``)."""
    shots = oracle_shots(method, tokenizer, pool[: max(30, 10 * k)], retriever)[:k]
    if len(shots) < k:
        raise RagrlError(
            f"--shots {k}: the oracle's trees on the pool give {len(shots)} kinds of worked step (R²AG shows "
            "at most 3: a first step, a later one and a stop)"
        )
    records = [
        Trajectory(
            state.id, [], [Segment("policy", [], reply)], metadata={CONTEXT_KEY: state.metadata[CONTEXT_KEY]}
        )
        for state, reply in shots
    ]
    return method.protocol.with_shots(shots), records


class SingleStepSteering:
    """Single-step retrieval (SR@N) through the tree: one step that queries the question itself and
    stops; with ``rollout.k = N`` the tree holds the question's top-N documents."""

    name = "single_step"

    def steer(self, example: Example, context: list[dict[str, str]], history: list[Steering]) -> str:
        return steering_text([squash_ws(example.question)], stop=True, think=SCRIPTED_THOUGHTS[2])


STEERERS = {"oracle": SteeringOracle, "single_step": SingleStepSteering}


class SteererBackend:
    """Plays a scripted steerer (``steer(example, context, history) -> str``) through ``R2agRollout``;
    its text is cut and tokenized as a model's generation would be (``scripted_generation``). A
    ``reader`` (a generation backend with the same tokenizer) answers from the tree when the rollout
    reads (``rollout.read``): scripted retrieval, a model's QA on top of it."""

    def __init__(self, tokenizer: Any, steerer: Any, reader: Any = None) -> None:
        self.tokenizer, self.steerer, self.reader = tokenizer, steerer, reader

    def steer_batch(self, states: Sequence[Any], params: SamplingParams) -> list[Generation]:
        """One steering step of each tree state (``example``, ``context``, ``history`` of its steps).
        The history a steerer reads holds the base queries that were retrieved: a query Top-Survivor
        left out was not asked, so the oracle asks it again."""
        texts = []
        for s in states:
            asked = s.asked
            history = [dataclasses.replace(h, base=tuple(q for q in h.base if q in asked)) for h in s.history]
            texts.append(self.steerer.steer(s.example, s.context, history))
        return [scripted_generation(self.tokenizer, t, params)[0] for t in texts]

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        if self.reader is None:
            raise RagrlError(
                f"the scripted steerer {type(self.steerer).__name__} cannot answer: give it a reader model "
                "(rollout.read)"
            )
        return self.reader.generate(prompts, params)
