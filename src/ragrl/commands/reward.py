"""``ragrl reward``: re-score saved completions or trajectories with a method's reward."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated

import typer

from ragrl.commands import METHOD_CHOICES
from ragrl.console import console
from ragrl.errors import RagrlError


def reward_command(
    method: Annotated[str, typer.Argument(metavar="METHOD", help=f"Method: {METHOD_CHOICES}.")],
    completions: Annotated[
        Path,
        typer.Option(
            help="jsonl of {id, completion} (the generated text after "
            "the prompt, observations included) or saved trajectories."
        ),
    ],
    gold: Annotated[Path, typer.Option(help="Canonical question file.")],
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            metavar="KEY=VALUE",
            help="Config override key.path=value (repeatable), e.g. reward.1.weight=0.2.",
        ),
    ] = None,
    step: Annotated[
        int, typer.Option(min=0, help="Training step the reward is computed at (for scheduled weights).")
    ] = 0,
    total_steps: Annotated[
        int, typer.Option(min=0, help="Planned training steps (0: scheduled weights stay as written).")
    ] = 0,
) -> None:
    """Re-score saved completions or trajectories with a method's reward: one JSON object per example
    (id, every component, the weights when a schedule changes them, each labelled schedule's multiplier
    such as TIRESRAG's a_t, total), then the means. With
    per-step components: one object per step (id, t, each per-step component, the weights, R_t) and one
    per episode (id, component sums, return). The whole file is scored as one batch (a batched
    component, such as an LLM judge, sees every episode)."""
    from ragrl.data.io import read_examples
    from ragrl.data.schema import Example
    from ragrl.methods import load_method
    from ragrl.rewards import RewardContext
    from ragrl.rollout.replay import read_completions
    from ragrl.rollout.trajectory import Trajectory

    method_obj = load_method(method, set_ or [])
    examples, _ = read_examples(gold)
    by_id = {ex.id: ex for ex in examples}
    totals: list[float] = []
    components: dict[str, list[float]] = {k: [] for k in method_obj.reward.keys}
    unknown: list[str] = []
    batch: list[tuple[str, Trajectory, Example]] = []
    for traj in read_completions(
        completions,
        method_obj.protocol,
        fallback=method_obj.rollout.answers_invalid,
    ):
        ex_id = traj.example_id
        example = by_id.get(ex_id)
        if example is None:
            unknown.append(ex_id)
            continue
        batch.append((ex_id, traj, example))
    ctx = RewardContext(step=step, total_steps=total_steps)
    results = method_obj.reward.score([t for _, t, _ in batch], [e for _, _, e in batch], ctx)
    for (ex_id, traj, _), result in zip(batch, results, strict=True):
        totals.append(result.total)
        for k, v in result.components.items():
            components[k].append(v)
        if result.steps is not None:  # per-step rewards: one line per step, then the episode's return
            log = method_obj.step_log(traj) if method_obj.step_log is not None else None
            for t, r_t in enumerate(result.steps):
                raw = {k: v[t] for k, v in result.step_components.items()}
                ws = {k: v[t] for k, v in result.step_weights.items()}
                what = {"action": log[t]} if log is not None else {}
                typer.echo(json.dumps({"id": ex_id, "t": t, **what, **raw, "weights": ws, "R_t": r_t}))
            typer.echo(json.dumps({"id": ex_id, **result.components, "return": result.total}))
            continue
        weights = {"weights": result.weights} if method_obj.reward.scheduled else {}
        row = {"id": ex_id, **result.components, **weights, **result.factors, "total": result.total}
        typer.echo(json.dumps(row))
    if unknown:
        console.print(f"warning: {len(unknown)} ids are not in {gold}, first: {', '.join(unknown[:5])}")
    if not totals:
        raise RagrlError(f"{completions}: nothing to score")
    means = {k: math.fsum(v) / len(v) for k, v in components.items()}
    typer.echo(
        json.dumps(
            {
                "mean": {**means, "total": math.fsum(totals) / len(totals)},
                "n": len(totals),
                "unknown_ids": len(unknown),
            }
        )
    )
