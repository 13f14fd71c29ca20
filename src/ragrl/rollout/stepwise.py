"""The step-wise rollout: the batched multi-turn engine, trained one step at a time.

``rollout.kind: stepwise`` plays episodes exactly as ``multi_turn`` does, but every policy turn is its
own training sample, whose prompt is the context the policy saw at that step. That is what an agent
whose context is not append-only needs: with a protocol that ``backtracks`` (EVO-RAG's BACKTRACK), a
backtrack takes the previous step (and the backtrack turn itself) out of the context the policy sees
from then on, while the trajectory keeps every segment, in time order, for rewards, logs and reports.
The token budget (``max_total_tokens``) counts the active context.

Each trajectory records, per policy segment, the segments it was generated after
(``metadata["contexts"]``); ``samples`` rebuilds each step's prompt from them, token for token.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence

from ragrl.data.schema import Example
from ragrl.errors import RagrlError
from ragrl.rollout.backtrack import hops_kept
from ragrl.rollout.engine import RolloutEngine, _Episode
from ragrl.rollout.registry import register_rollout
from ragrl.rollout.sample import Sample
from ragrl.rollout.trajectory import Trajectory


@register_rollout("stepwise")
class StepwiseRollout(RolloutEngine):
    keeps_step_contexts = True

    def resume(
        self, prefixes: Sequence[Trajectory], examples: Sequence[Example], seed: int | None = None
    ) -> list[Trajectory]:
        """Play recorded episode prefixes on to their end with this rollout's policy and budgets (a
        sibling branch completed by the policy: EVO-RAG's ``return_mode: rollout``). A prefix is a
        step-wise record (one action and one context per step, the last step's observation included);
        the engine's state (the active context, each step's segments, a backtrack's effect, the
        invalid count) is rebuilt from it, and the turns go on from the next step. A prefix that ended
        (an answer, a refusal) comes back unchanged. Each prefix's ``metadata`` ``group`` and
        ``sample`` seed its sampling."""
        cfg, t0 = self.config, time.perf_counter()
        episodes, starts = [], []
        for prefix, example in zip(prefixes, examples, strict=True):
            ep = _Episode(example, copy.deepcopy(prefix))
            policy = [i for i, s in enumerate(ep.traj.segments) if s.kind == "policy"]
            if len(policy) != len(ep.traj.actions) or not policy:
                raise RagrlError(
                    f"cannot resume the episode of {prefix.example_id!r}: not a step-wise record"
                )
            ep.traj.metadata.setdefault("sample", 0)
            note = self.protocol.final_turn_note
            last = ep.traj.segments[-1]
            told = bool(note) and last.kind == "env" and last.text == note  # cut right before the forced turn
            bounds = [*policy, len(ep.traj.segments) - told]
            for k, action in enumerate(ep.traj.actions):
                ep.contexts.append(list(ep.active))
                ep.steps.append([])
                for i in range(bounds[k], bounds[k + 1]):
                    ep.attach(i)
                if self.protocol.is_backtrack(action):
                    ep.backtrack(hops_kept(action, ep.hops)[0])
                ep.invalid += action.kind == "invalid"
            if told:  # the note came after the last step (and after its backtrack, if it was one)
                ep.attach(len(ep.traj.segments) - 1)
                ep.traj.metadata["forced_answer"] = True
            ep.done = self.protocol.is_final(ep.traj.actions[-1])
            if ep.done:
                ep.traj.metadata["contexts"] = [list(c) for c in ep.contexts]
            episodes.append(ep)
            starts.append(len(policy))
        for turn in range(min(starts, default=cfg.max_turns), cfg.max_turns):
            active = [ep for ep, start in zip(episodes, starts, strict=True) if not ep.done and start <= turn]
            if active:
                self._turn(
                    active,
                    turn,
                    seed,
                    execute_search=turn + 1 < cfg.max_turns or cfg.final_answer_turn,
                    t0=t0,
                )
        self._final_turn(
            [
                ep
                for ep, start in zip(episodes, starts, strict=True)
                if not ep.done and start <= cfg.max_turns
            ],
            seed,
            t0,
        )
        for ep in episodes:
            if not ep.done:
                self._finish(ep, "max_turns", truncated=True, t0=t0)
        return [ep.traj for ep in episodes]

    def samples(self, episodes: Sequence[Trajectory]) -> list[Sample]:
        """One sample per policy turn: the prompt plus that turn's context, then the turn's own tokens;
        grouped by the question, numbered by step."""
        out = []
        for e, t in enumerate(episodes):
            policy = [i for i, s in enumerate(t.segments) if s.kind == "policy"]
            contexts = t.metadata.get("contexts")
            if contexts is None or len(contexts) != len(policy):
                raise ValueError(
                    f"trajectory of {t.example_id!r} has no step contexts: not a stepwise rollout"
                )
            for step, (i, context) in enumerate(zip(policy, contexts, strict=True)):
                seg = t.segments[i]
                out.append(
                    Sample(
                        prompt_ids=list(t.prompt_ids) + [x for j in context for x in t.segments[j].token_ids],
                        completion_ids=list(seg.token_ids),
                        loss_mask=[1] * len(seg.token_ids),
                        completion_logprobs=list(seg.logprobs or [0.0] * len(seg.token_ids)),
                        group=int(t.metadata.get("group", 0)),
                        episode=e,
                        step=step,
                        example_id=t.example_id,
                    )
                )
        return out
