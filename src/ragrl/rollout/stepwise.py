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

from collections.abc import Sequence

from ragrl.rollout.engine import RolloutEngine
from ragrl.rollout.registry import register_rollout
from ragrl.rollout.sample import Sample
from ragrl.rollout.trajectory import Trajectory


@register_rollout("stepwise")
class StepwiseRollout(RolloutEngine):
    keeps_step_contexts = True

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
