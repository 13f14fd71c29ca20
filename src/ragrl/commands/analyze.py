"""``ragrl analyze-thinking``: TIRESRAG-R1's failure-pattern analysis (spec §4) of saved trajectories."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from ragrl.commands import SetOption
from ragrl.console import console
from ragrl.errors import RagrlError


def analyze_thinking_command(
    trajectories: Annotated[
        Path,
        typer.Option(
            help="Saved trajectories (ragrl eval's trajectories.jsonl, a training samples.jsonl) or a "
            "jsonl of {id, completion}."
        ),
    ],
    gold: Annotated[Path, typer.Option(help="Canonical question file (the gold answers).")],
    config: Annotated[
        str,
        typer.Option(help="Method config whose tiresrag_sufficiency component sets the judge and prompts."),
    ] = "tiresrag",
    set_: SetOption = None,
    out: Annotated[
        Path | None, typer.Option(help="Write each episode's verdict here (jsonl: category, cuts' verdicts).")
    ] = None,
) -> None:
    """Over-, good and under-thinking by correctness (the paper's Table 1): the sufficiency judge reads
    each episode cut after every search, and whole; the first sufficient cut sets the category
    (docs/tiresrag.md). Prints the table as markdown, then a JSON summary line."""
    from ragrl.data.io import read_examples, write_jsonl
    from ragrl.methods import load_method
    from ragrl.methods.tiresrag.analysis import analyze_thinking, table1, table1_markdown
    from ragrl.rollout.replay import read_completions

    method = load_method(config, set_ or [])
    component = next((c for c in method.reward.components if c.name == "tiresrag_sufficiency"), None)
    if component is None:
        raise RagrlError(f"{config}: the reward has no tiresrag_sufficiency component (the judge to use)")
    by_id = {ex.id: ex for ex in read_examples(gold)[0]}
    episodes = read_completions(
        trajectories,
        method.protocol,
        fallback=method.rollout.answers_invalid,
    )
    unknown = [t.example_id for t in episodes if t.example_id not in by_id]
    if unknown:
        console.print(f"warning: {len(unknown)} ids are not in {gold}, first: {', '.join(unknown[:5])}")
    episodes = [t for t in episodes if t.example_id in by_id]
    if not episodes:
        raise RagrlError(f"{trajectories}: no episode to analyze")
    verdicts = analyze_thinking(episodes, [by_id[t.example_id] for t in episodes], **dict(component.params))
    if out is not None:
        write_jsonl(out, (v.to_dict() for v in verdicts))
    typer.echo(table1_markdown(verdicts))
    judge = dict(component.params.get("judge") or {"kind": "proxy"})
    summary = {
        "table1": table1(verdicts),
        "n": len(verdicts),
        "unknown_ids": len(unknown),
        "judge": judge.get("model", judge.get("path", judge["kind"])),
        "judge_requests": sum(len(v.sufficient) for v in verdicts),
        "parse_failures": sum(v.unreadable for v in verdicts),
    }
    typer.echo(json.dumps(summary))
