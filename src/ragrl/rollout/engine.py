"""The batched multi-turn rollout engine: tokens in, tokens out.

``RolloutEngine(backend, retriever, protocol, config).run(examples, n)`` plays ``n`` episodes per
example and returns ``len(examples) * n`` ``Trajectory`` records, grouped (the ``n`` samples of an
example are consecutive, with ``metadata["group"]`` = the example's index and ``metadata["sample"]``).

Each turn:

1. all *active* trajectories are generated in ONE ``backend.generate`` call; a prompt is the episode's
   prompt ids plus every segment token so far (exactly as generated / appended, never re-tokenized;
   after a backtrack, ``rollout/stepwise.py``, only the segments still in the active context);
2. each generated segment is kept as a policy segment (text = ``decode(token_ids)``) and parsed by the
   protocol, on that segment's text only;
3. all search queries of the turn go to the retriever in ONE ``retriever.search`` call;
4. each observation (passages, or the corrective message for an invalid action) is tokenized once
   (``encode(text, add_special_tokens=False)``) and appended as an env segment (loss mask 0);
5. if the protocol asks for a follow-up (``Protocol.followup_stop``, Eval-RAR's separate evaluation),
   every episode that just received passages generates once more in ONE ``generate`` call, stopped by
   those strings; the segment is a policy segment and ``parse_followup`` of it is recorded as a
   second action of the same step. EOS there ends the episode ``"eos"``.

Budgets and their recorded outcomes (``Trajectory.finish_reason`` / ``truncated``):

* ``max_turns`` policy turns; an episode still running after them ends ``"max_turns"`` (truncated),
  unless ``final_answer_turn`` grants one more generation, whose search is not executed (the episode
  is marked ``metadata["forced_answer"]``, after the protocol's ``final_turn_note``, if any);
* ``max_total_tokens``: the completion (policy + env tokens; after a backtrack, those of the active
  context) never exceeds it. Each turn may generate
  ``min(max_new_tokens, remaining)`` tokens; an observation that does not fit is cut to the remaining
  budget and the episode ends ``"max_tokens"`` (truncated), as does a turn that uses up the budget;
* ``max_new_tokens`` per turn: a cut turn has ``finish_reason == "length"`` on its segment;
* ``max_obs_tokens``: longer observations are cut to it (``Segment.truncated``);
* ``max_invalid``: that many invalid actions end the episode ``"invalid_limit"``;
* EOS without an answer ends the episode ``"eos"`` (an unexecuted search in that turn is recorded with
  ``error``); an answer ends it ``"answer"``, unless the protocol asks for another pass
  (``Protocol.after_answer``, a reflection) and a turn and room for its text are left.

The generate call of a turn uses the largest per-trajectory token allowance; a generation longer than
its own trajectory's allowance is cut to it (a prefix of a sample is a sample, log-probs stay exact) and
marked ``"length"``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from ragrl.data.schema import Example
from ragrl.errors import RagrlError
from ragrl.llm.backend import Generation, GenerationBackend
from ragrl.retrieval.base import Retriever
from ragrl.rollout.backtrack import hops_kept
from ragrl.rollout.config import RolloutConfig
from ragrl.rollout.limits import check_prompt_length
from ragrl.rollout.protocol import Protocol, read_turn, squash_ws
from ragrl.rollout.registry import register_rollout
from ragrl.rollout.sample import Sample
from ragrl.rollout.trajectory import Action, Segment, Trajectory

FOLLOWUP_STEP = 1_000
"""Follow-up generations sample with the seeds of step ``FOLLOWUP_STEP + turn``."""


RESAMPLE_STEP = 100_000
"""The ``a``-th resample of an invalid turn samples with the seeds of step ``a * RESAMPLE_STEP + turn``."""


def turn_seed(seed: int | None, turn: int) -> int | None:
    """The seed of one turn's generate call, derived from the run's seed (None stays None)."""
    if seed is None:
        return None
    return (int(seed) * 1_000_003 + turn * 7919 + 17) % (2**31 - 1)


def episode_seed(seed: int, turn: int, group: int, sample: int) -> int:
    """The sampling seed of one episode's turn: a function of the run's seed, the turn, the example's
    group index and the sample index only, so an episode samples the same tokens whichever other
    episodes share its generate call (a batch split across processes gives the same rollouts)."""
    base = turn_seed(seed, turn)
    assert base is not None
    return (base * 1_000_033 + group * 65_537 + sample * 257 + 1) % (2**61 - 1)


@dataclass
class _Episode:
    example: Example
    traj: Trajectory
    done: bool = False
    invalid: int = 0
    reflecting: bool = False
    """The episode answered and was asked for a reflection pass (``Protocol.after_answer``)."""
    t_generate: float = 0.0
    t_retrieve: float = 0.0
    pending: list[tuple[Action, Segment | None]] = field(default_factory=list)
    active: list[int] = field(default_factory=list)
    """Indices of the segments the policy sees (all of them, unless a backtrack dropped some)."""
    steps: list[list[int]] = field(default_factory=list)
    """The segments each step added to the active context (what a backtrack takes back)."""
    contexts: list[list[int]] = field(default_factory=list)
    """Per policy segment, in order: the active segments it was generated after."""

    @property
    def used(self) -> int:
        """Tokens of the active context (the token budget counts what the policy sees)."""
        return sum(len(self.traj.segments[i].token_ids) for i in self.active)

    def add(self, segment: Segment) -> None:
        """Append a segment to the record, the active context and the current step."""
        self.traj.segments.append(segment)
        self.attach(len(self.traj.segments) - 1)

    def attach(self, index: int) -> None:
        """Put a recorded segment into the active context and the current step; text that follows a
        backtrack which emptied the context (the forced answer turn's note) opens a step of its own."""
        self.active.append(index)
        if not self.steps:
            self.steps.append([])
        self.steps[-1].append(index)

    @property
    def hops(self) -> int:
        """The steps in the active context before the current one (what a backtrack may take back)."""
        return len(self.steps) - 1

    def backtrack(self, keep: int) -> None:
        """Keep the first ``keep`` hops in the active context and drop the later ones and the backtrack
        step itself (``ragrl.rollout.backtrack``); the record keeps every segment, and the step count
        goes on (EVO-RAG's BACKTRACK)."""
        for step in self.steps[keep:]:
            dropped = set(step)
            self.active = [i for i in self.active if i not in dropped]
        del self.steps[keep:]


@register_rollout("multi_turn")
class RolloutEngine:
    """The linear multi-turn rollout (see the module docstring): one ``Trajectory`` per episode, one
    training sample per episode."""

    keeps_step_contexts = False
    """True in ``StepwiseRollout``: each trajectory records the context of every step
    (``metadata["contexts"]``), so a backtracking protocol may drop context."""

    def __init__(
        self,
        backend: GenerationBackend,
        retriever: Retriever | None,
        protocol: Protocol,
        config: RolloutConfig | None = None,
    ) -> None:
        self.backend = backend
        self.retriever = retriever
        self.protocol = protocol
        self.config = config or RolloutConfig()
        self.tokenizer = backend.tokenizer
        if getattr(protocol, "backtracks", False) and not self.keeps_step_contexts:
            raise RagrlError(
                f"the {protocol.name} protocol backtracks, so its episodes are not linear: use rollout.kind "
                "stepwise (one training sample per step, each with the context the policy saw)"
            )
        if getattr(protocol, "backtracks", False) and protocol.followup_stop:
            raise RagrlError(  # a backtrack counts one action per step (rollout/backtrack.py)
                f"the {protocol.name} protocol both backtracks and has follow-up generations: not supported"
            )

    # -- helpers ------------------------------------------------------------------------------------
    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def _encode_obs(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _finish(self, ep: _Episode, reason: str, *, truncated: bool, t0: float) -> None:
        ep.done = True
        if self.keeps_step_contexts:
            ep.traj.metadata["contexts"] = [list(c) for c in ep.contexts]
        ep.traj.finish_reason = reason
        ep.traj.truncated = truncated
        ep.traj.timings = {
            "generate": ep.t_generate,
            "retrieve": ep.t_retrieve,
            "total": time.perf_counter() - t0,
        }

    def _append_obs(self, ep: _Episode, text: str, t0: float) -> None:
        """Tokenize an observation once, cut it to the budgets, append it; end the episode if the total
        budget is used up."""
        cfg = self.config
        ids = self._encode_obs(text)
        truncated = False
        if len(ids) > cfg.max_obs_tokens:
            ids, truncated = ids[: cfg.max_obs_tokens], True
        remaining = cfg.max_total_tokens - ep.used
        over_budget = len(ids) > remaining
        if over_budget:
            ids, truncated = ids[: max(remaining, 0)], True
        if ids:
            seg_text = self._decode(ids) if truncated else text
            ep.add(Segment("env", ids, seg_text, truncated=truncated))
        if over_budget or ep.used >= cfg.max_total_tokens:
            self._finish(ep, "max_tokens", truncated=True, t0=t0)

    # -- the loop ------------------------------------------------------------------------------------
    def run(
        self,
        examples: Sequence[Example],
        n: int | None = None,
        seed: int | None = None,
        *,
        first_group: int = 0,
    ) -> list[Trajectory]:
        """Play ``n`` episodes per example. ``first_group`` numbers the groups from that index (a process
        holding a shard of a larger batch passes its offset, so groups and seeds are global)."""
        cfg = self.config
        n = cfg.n if n is None else n
        if n < 1:
            raise RagrlError(f"n must be >= 1, got {n}")
        seed = cfg.seed if seed is None else seed
        t0 = time.perf_counter()

        episodes: list[_Episode] = []
        for g, ex in enumerate(examples):
            prompt = list(self.protocol.prompt_ids(ex, self.tokenizer))
            check_prompt_length(ex, prompt, cfg)
            for s in range(n):
                traj = Trajectory(
                    example_id=ex.id,
                    prompt_ids=list(prompt),
                    metadata={"group": first_group + g, "sample": s, "protocol": self.protocol.name},
                )
                if s < cfg.greedy_samples:
                    traj.metadata["greedy"] = True
                episodes.append(_Episode(ex, traj))

        for turn in range(cfg.max_turns):
            active = [ep for ep in episodes if not ep.done]
            if not active:
                break
            # another turn follows this one: a search here gets executed
            execute_search = turn + 1 < cfg.max_turns or cfg.final_answer_turn
            self._turn(active, turn, seed, execute_search=execute_search, t0=t0)

        self._final_turn([ep for ep in episodes if not ep.done], seed, t0)
        for ep in episodes:
            if not ep.done:
                self._finish(ep, "max_turns", truncated=True, t0=t0)
        return [ep.traj for ep in episodes]

    def _final_turn(self, leftover: list[_Episode], seed: int | None, t0: float) -> None:
        """``final_answer_turn``: one more turn for the unfinished episodes, whose search is not run;
        each is marked ``metadata["forced_answer"]``, after the protocol's ``final_turn_note`` (if any)
        tells the policy to answer now."""
        if not leftover or not self.config.final_answer_turn:
            return
        for ep in leftover:
            told = ep.traj.metadata.get("forced_answer", False)  # a resumed prefix may hold the note already
            ep.traj.metadata["forced_answer"] = True
            if self.protocol.final_turn_note and not told:
                self._append_obs(ep, self.protocol.final_turn_note, t0)
        leftover = [ep for ep in leftover if not ep.done]
        if leftover:
            self._turn(leftover, self.config.max_turns, seed, execute_search=False, t0=t0)

    def samples(self, episodes: Sequence[Trajectory]) -> list[Sample]:
        """One sample per episode: its prompt, its whole completion, grouped by its question."""
        return [Sample.from_trajectory(t, i) for i, t in enumerate(episodes)]

    def _turn(
        self, active: list[_Episode], turn: int, seed: int | None, *, execute_search: bool, t0: float
    ) -> None:
        cfg = self.config
        allowance = [self._allowance(ep) for ep in active]
        # an episode with no budget left was already ended by _append_obs; guard anyway
        for ep, a in zip(active, allowance, strict=True):
            if a < 1:
                self._finish(ep, "max_tokens", truncated=True, t0=t0)
        pairs = [(ep, a) for ep, a in zip(active, allowance, strict=True) if a >= 1]
        if not pairs:
            return
        generated = self._generate(pairs, turn, seed, self.protocol.stop)
        if cfg.resample_invalid and cfg.temperature > 0:
            self._resample_invalid(pairs, generated, turn, seed)
        searches: list[tuple[_Episode, Action]] = []
        for (ep, _), (text, finish) in zip(pairs, generated, strict=True):
            action, fell_back = read_turn(
                self.protocol,
                text,
                turn,
                ep.hops,
                fallback=cfg.answers_invalid and not ep.reflecting,
                tokenizer=self.tokenizer,
            )
            if fell_back:
                ep.traj.metadata.setdefault("fallback_answers", []).append(turn)
            if ep.reflecting and action.kind == "invalid":
                # a reflection pass that neither searches nor answers again declines to revise: the
                # episode ends with the answer it gave (the turn is kept as a "reflect" action)
                ep.traj.actions.append(Action("reflect", content=squash_ws(text), turn=turn))
                self._finish(ep, "answer", truncated=False, t0=t0)
                continue
            ep.traj.actions.append(action)

            if self.protocol.is_backtrack(action):
                ep.backtrack(hops_kept(action, ep.hops)[0])  # those steps leave the context; t goes on
                if finish == "eos":
                    self._finish(ep, "eos", truncated=False, t0=t0)
                continue
            if self.protocol.is_final(action):
                ep.traj.final_answer = action.content
                again = self.protocol.after_answer(ep.traj, action) if execute_search else None
                fits = again is not None and len(self._encode_obs(again)) < cfg.max_total_tokens - ep.used
                if not fits or finish == "eos":  # no reflection that would not fit whole, or leave no room
                    self._finish(ep, "answer", truncated=False, t0=t0)
                else:  # one more pass in the same episode (a reflection): its answer, if any, is final
                    ep.reflecting = True
                    self._append_obs(ep, again, t0)
                continue
            if finish == "eos":
                if action.kind != "invalid" and action.error is None:
                    action.error = "not executed: the turn ended with EOS"
                self._finish(ep, "eos", truncated=False, t0=t0)
                continue
            budget_left = cfg.max_total_tokens - ep.used
            if action.kind == "invalid":
                ep.invalid += 1
                if cfg.max_invalid is not None and ep.invalid >= cfg.max_invalid:
                    self._finish(ep, "invalid_limit", truncated=False, t0=t0)
                    continue
            if budget_left <= 0:
                if self.protocol.is_search(action) and action.error is None:
                    action.error = "not executed: token budget used up"
                self._finish(ep, "max_tokens", truncated=True, t0=t0)
                continue
            if action.kind == "invalid":
                if execute_search:  # a corrective only makes sense if another turn follows
                    self._append_obs(ep, self.protocol.corrective(action), t0)
            elif self.protocol.is_search(action):
                if execute_search and self.retriever is not None:
                    searches.append((ep, action))
                elif action.error is None:
                    action.error = "not executed: no turn left" if self.retriever else "no retriever"

        if searches:
            t = time.perf_counter()
            results = self.retriever.search([a.content for _, a in searches], self.config.k)  # type: ignore[union-attr]
            dt = time.perf_counter() - t
            if len(results) != len(searches):
                raise RagrlError(
                    f"retriever returned {len(results)} result lists for {len(searches)} queries"
                )
            for (ep, action), hits in zip(searches, results, strict=True):
                ep.t_retrieve += dt
                action.retrieved_ids = [h.id for h in hits]
                action.retrieved_scores = [float(h.score) for h in hits]
                action.retrieved_titles = [h.passage.title for h in hits]
                self._append_obs(ep, self.protocol.observation(action, hits), t0)
            if self.protocol.followup_stop:
                self._followup([ep for ep, _ in searches if not ep.done], turn, seed, t0)

    def _resample_invalid(
        self, pairs: list[tuple[_Episode, int]], generated: list[tuple[str, str]], turn: int, seed: int | None
    ) -> None:
        """``resample_invalid``: the turns whose action is invalid are generated again (a fresh seed
        stream per attempt, one batched call per attempt) until valid or out of attempts; ``generated``
        is updated in place. A reflection pass is not resampled (an invalid one declines to revise), nor
        a greedy episode (it would repeat itself)."""
        pending = [
            i for i, (ep, _) in enumerate(pairs) if not ep.reflecting and not ep.traj.metadata.get("greedy")
        ]
        for attempt in range(1, self.config.resample_invalid + 1):
            redo = []
            for i in pending:  # only the turns resampled last time can still be invalid
                ep, text = pairs[i][0], generated[i][0]
                action, _ = read_turn(self.protocol, text, turn, ep.hops)
                if action.kind == "invalid":
                    redo.append(i)
                    ep.traj.segments.pop()  # the turn leaves the record, its step and its context
                    ep.active.pop()
                    ep.steps.pop()
                    ep.contexts.pop()
                    ep.traj.metadata.setdefault("resampled", []).append(
                        {"turn": turn, "text": text, "error": action.error}
                    )
            if not redo:
                return
            again = self._generate(
                [pairs[i] for i in redo], attempt * RESAMPLE_STEP + turn, seed, self.protocol.stop
            )
            for i, result in zip(redo, again, strict=True):
                generated[i] = result
            pending = redo

    def _context_ids(self, ep: _Episode) -> list[int]:
        """The tokens after the prompt that the policy sees: its active segments, in order."""
        return [t for i in ep.active for t in ep.traj.segments[i].token_ids]

    def _allowance(self, ep: _Episode) -> int:
        """New tokens the episode may generate now: ``max_new_tokens``, shrunk to the total budget left."""
        return min(self.config.max_new_tokens, self.config.max_total_tokens - ep.used)

    def _generate(
        self,
        pairs: list[tuple[_Episode, int]],
        step: int,
        seed: int | None,
        stop: tuple[str, ...],
        *,
        new_step: bool = True,
    ) -> list[tuple[str, str]]:
        """One batched generate call (two with ``greedy_samples``: the greedy episodes and the sampled
        ones): each episode's prompt plus its segments so far, at most its allowance of new tokens;
        appends each generation as a policy segment and returns ``(text, finish_reason)`` per episode.
        ``step`` derives the sampling seeds."""
        cfg = self.config
        prompts = [ep.traj.prompt_ids + self._context_ids(ep) for ep, _ in pairs]
        seeds = None
        if seed is not None:
            seeds = tuple(
                episode_seed(seed, step, ep.traj.metadata["group"], ep.traj.metadata["sample"])
                for ep, _ in pairs
            )
        # one generate call, or two when the batch holds greedy episodes (greedy_samples) and sampled ones
        greedy = [bool(ep.traj.metadata.get("greedy")) for ep, _ in pairs]
        gens: list[Generation | None] = [None] * len(pairs)
        seconds = [0.0] * len(pairs)
        for mode in dict.fromkeys(greedy):
            rows = [i for i, g in enumerate(greedy) if g == mode]
            params = cfg.sampling(
                max(pairs[i][1] for i in rows),
                stop,
                turn_seed(seed, step),
                None if seeds is None else tuple(seeds[i] for i in rows),
            )
            if mode:
                params = dataclasses.replace(params, temperature=0.0)
            t = time.perf_counter()
            out_rows = self.backend.generate([prompts[i] for i in rows], params)
            dt = time.perf_counter() - t
            if len(out_rows) != len(rows):
                raise RagrlError(f"backend returned {len(out_rows)} generations for {len(rows)} prompts")
            for i, gen in zip(rows, out_rows, strict=True):
                gens[i], seconds[i] = gen, dt
        out = []
        for (ep, a), gen, dt in zip(pairs, gens, seconds, strict=True):
            assert gen is not None  # every row belongs to one of the calls
            ep.t_generate += dt
            ids, logprobs, finish = _cut(gen, a)
            text = self._decode(ids)
            if new_step:  # a turn opens a step; a follow-up belongs to its search's step
                ep.steps.append([])
            ep.contexts.append(list(ep.active))
            ep.add(Segment("policy", ids, text, logprobs=logprobs, finish_reason=finish))
            out.append((text, finish))
        return out

    def _followup(self, episodes: list[_Episode], turn: int, seed: int | None, t0: float) -> None:
        """The protocol's follow-up generation after a search's observation (see the module doc)."""
        cfg = self.config
        pairs = [(ep, self._allowance(ep)) for ep in episodes]
        pairs = [(ep, a) for ep, a in pairs if a >= 1]  # no budget left: _append_obs ended it
        if not pairs:
            return
        # its own seed stream: FOLLOWUP_STEP + turn never collides with a turn index
        results = self._generate(
            pairs, FOLLOWUP_STEP + turn, seed, self.protocol.followup_stop, new_step=False
        )
        for (ep, _), (text, finish) in zip(pairs, results, strict=True):
            ep.traj.actions.append(self.protocol.parse_followup(text, turn))
            if finish == "eos":
                self._finish(ep, "eos", truncated=False, t0=t0)
            elif ep.used >= cfg.max_total_tokens:
                self._finish(ep, "max_tokens", truncated=True, t0=t0)


def _cut(gen: Generation, allowance: int) -> tuple[list[int], list[float], str]:
    ids = [int(t) for t in gen.token_ids]
    logprobs = [float(x) for x in gen.logprobs] if gen.logprobs is not None else [0.0] * len(ids)
    if len(logprobs) != len(ids):
        raise RagrlError(f"backend returned {len(logprobs)} log-probs for {len(ids)} tokens")
    finish = gen.finish_reason
    if len(ids) > allowance:
        ids, logprobs, finish = ids[:allowance], logprobs[:allowance], "length"
    return ids, logprobs, finish
