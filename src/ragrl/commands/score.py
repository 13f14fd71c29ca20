"""``ragrl score``: score a predictions file against a canonical question file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from ragrl.console import console, styled
from ragrl.data.io import write_jsonl
from ragrl.errors import RagrlError
from ragrl.metrics.normalize import VARIANTS
from ragrl.metrics.score import DEFAULT_KS, NO_GROUP, parse_metrics, score_files, unscored

GROUP_COLUMNS = ("em", "f1", "cover_em", "acc", "recall@5", "recall@10")
"""The metrics a ``--by`` table shows, where scored (scores.json holds every one)."""


def _parse_ks(text: str) -> list[int]:
    try:
        ks = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise RagrlError(f"--ks: expected comma-separated positive integers, got {text!r}") from None
    if not ks or any(k < 1 for k in ks):
        raise RagrlError(f"--ks: expected comma-separated positive integers, got {text!r}")
    return ks


BY_HELP = (
    "Also score each value of this metadata key apart (source: each dataset of a mixed file; type, hops, "
    "...): a table on stderr and the JSON's `by`."
)


def print_groups(summary: dict) -> None:
    """The ``--by`` table of a summary: each group's size and its main metrics, the whole file last; a
    warning counts the questions without the key."""
    from rich.table import Table

    by = summary.get("by")
    if not by:
        return
    groups = by["groups"]
    shown = [m for m in GROUP_COLUMNS if m in summary]
    table = Table(by["key"], "n", *shown, title=f"by metadata.{by['key']}")
    for name, entry in groups.items():
        table.add_row(name, str(entry["n"]), *(f"{entry[m]:.4f}" if m in entry else "—" for m in shown))
    table.add_row("all", str(sum(e["n"] for e in groups.values())), *(f"{summary[m]:.4f}" for m in shown))
    console.print(table)
    if NO_GROUP in groups:
        n = groups[NO_GROUP]["n"]
        plural = "s" if n != 1 else ""
        message = f"{n} scored question{plural} without metadata.{by['key']}: grouped as {NO_GROUP}"
        console.print(styled("warning:", "yellow", message))


def score(
    predictions: Annotated[
        Path,
        typer.Argument(
            help="Predictions jsonl: {id, prediction} per line, optionally retrieved_ids, "
            "retrieved_texts and supporting_facts (a list of title, sent_id pairs).",
            show_default=False,
        ),
    ],
    gold: Annotated[
        Path,
        typer.Option(
            "--gold", "-g", help="Canonical question file (jsonl) with the gold answers.", show_default=False
        ),
    ],
    variant: Annotated[
        str,
        typer.Option(
            "--variant", "-v", help="Answer normalization: " + ", ".join(VARIANTS) + " (see docs/metrics.md)."
        ),
    ] = "squad",
    metrics: Annotated[
        str | None,
        typer.Option(
            "--metrics",
            "-m",
            help="Comma-separated metrics or groups (answer, sp, joint, retrieval; em, f1, "
            "cover_em, acc, recall@5, mrr, ...). Default: every applicable metric.",
        ),
    ] = None,
    ks: Annotated[str, typer.Option("--ks", help="Retrieval cut-offs, comma-separated.")] = ",".join(
        map(str, DEFAULT_KS)
    ),
    per_example: Annotated[
        Path | None,
        typer.Option("--per-example", help="Also write every metric per id to this jsonl file."),
    ] = None,
    missing_as_zero: Annotated[
        bool,
        typer.Option(
            "--missing-as-zero",
            help="Count gold examples without a prediction as 0 (the official HotpotQA "
            "script's averaging) instead of leaving them out of the means.",
        ),
    ] = False,
    bootstrap: Annotated[
        int,
        typer.Option(
            "--bootstrap", min=0, help="Bootstrap resamples for 95% confidence intervals (0: none)."
        ),
    ] = 0,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the bootstrap.")] = 0,
    by: Annotated[str | None, typer.Option("--by", metavar="KEY", help=BY_HELP)] = None,
) -> None:
    """Score predictions against a canonical question file; prints one JSON object on stdout."""
    result = score_files(
        predictions,
        gold,
        variant=variant,
        metrics=metrics,
        ks=_parse_ks(ks),
        missing_as_zero=missing_as_zero,
        bootstrap=bootstrap,
        seed=seed,
        by=by,
    )
    summary = result.summary
    if summary["n_gold"] == 0:
        raise RagrlError(f"{gold}: holds no questions; nothing to score")
    if summary["n_scored"] == 0:
        first = ", ".join(summary["unknown_ids"]["first_ids"]) or "none"
        raise RagrlError(
            f"nothing to score: none of the {summary['n_predictions']} predictions in {predictions} has an "
            f"id of the {summary['n_gold']} questions in {gold} (first prediction ids: {first})"
        )
    absent = unscored(parse_metrics(metrics, _parse_ks(ks)), summary["n_per_metric"]) if metrics else {}
    if absent and not any(summary["n_per_metric"].values()):
        reasons = "; ".join(f"{name}: {why}" for name, why in absent.items())
        raise RagrlError(f"no metric --metrics asks for could be scored on {predictions} ({reasons})")
    for name, why in absent.items():
        console.print(styled("warning:", "yellow", f"{name} was not scored: {why}"))
    for key, label in (
        ("missing_predictions", "gold examples have no prediction"),
        ("unknown_ids", "predictions have an id not in the gold file"),
    ):
        info = summary[key]
        if info["count"]:
            message = f"{info['count']} {label}, first: {', '.join(info['first_ids'])}"
            console.print(styled("warning:", "yellow", message))
    if per_example is not None:
        write_jsonl(per_example, result.per_example)
        console.print(f"wrote {len(result.per_example)} per-example rows to {per_example}", highlight=False)
    print_groups(summary)
    typer.echo(json.dumps(summary, indent=2, ensure_ascii=False))


def aggregate(
    runs: Annotated[
        list[Path],
        typer.Argument(
            help="One JSON object per run: scores.json of `ragrl eval`, summary.json of a training run, ...",
            show_default=False,
        ),
    ],
    only: Annotated[
        str | None,
        typer.Option("--only", help="Comma-separated metric names to keep (nested ones as a/b), e.g. em,f1."),
    ] = None,
) -> None:
    """Mean and sample standard deviation of every numeric value over runs (seeds): a table on stderr,
    one JSON object on stdout ({runs, metrics: {name: {mean, std, n, values}}, partial, not_numbers})."""
    from rich.table import Table

    from ragrl.metrics.seeds import aggregate_runs

    records = []
    for path in runs:
        try:
            record = json.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise RagrlError(f"{path}: no such file") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise RagrlError(f"{path}: not a JSON file ({e})") from None
        if not isinstance(record, dict):
            raise RagrlError(f"{path}: expected a JSON object, got {type(record).__name__}")
        records.append(record)
    result = aggregate_runs(records)
    if only is not None:
        wanted = [name.strip() for name in only.split(",") if name.strip()]
        unknown = [name for name in wanted if name not in result["metrics"]]
        if unknown:
            raise RagrlError(
                f"--only: {', '.join(unknown)} is not a number in any run "
                f"(numbers: {', '.join(list(result['metrics'])[:20])}, ...)"
            )
        result["metrics"] = {name: result["metrics"][name] for name in wanted}
        result["partial"] = [name for name in result["partial"] if name in wanted]
    table = Table("metric", "mean", "± std", "runs", title=f"{len(records)} runs")
    for name, m in result["metrics"].items():
        std = "" if m["std"] is None else f"{m['std']:.4f}"
        table.add_row(name, f"{m['mean']:.4f}", std, str(m["n"]))
    console.print(table)
    for name in result["partial"]:
        n = result["metrics"][name]["n"]
        console.print(styled("warning:", "yellow", f"{name} is in {n} of the {len(records)} runs only"))
    typer.echo(json.dumps(result, indent=2, ensure_ascii=False))


def _scored_from(per_example: Path) -> dict:
    """What an evaluation folder's ``scores.json`` says it scored (``data``, ``variant``); empty for a
    ``ragrl score --per-example`` file, which has none beside it."""
    path = per_example.parent / "scores.json"
    try:
        scores = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(scores, dict):
        return {}
    provenance = scores.get("provenance") if isinstance(scores.get("provenance"), dict) else {}
    return {
        "data": provenance.get("data"),
        "data_sha256": provenance.get("data_sha256"),
        "variant": scores.get("variant"),
    }


def compare(
    a: Annotated[
        Path,
        typer.Argument(
            metavar="A",
            help="The baseline: per_example.jsonl of `ragrl eval` or `ragrl score --per-example`, or an "
            "evaluation folder.",
            show_default=False,
        ),
    ],
    b: Annotated[
        Path, typer.Argument(metavar="B", help="The run compared with A, the same way.", show_default=False)
    ],
    metrics: Annotated[
        str, typer.Option("--metrics", "-m", help="Comma-separated metrics to compare.")
    ] = "em,f1",
    resamples: Annotated[int, typer.Option(min=1, help="Bootstrap and permutation resamples.")] = 10_000,
    seed: Annotated[int, typer.Option(help="Seed of the resampling.")] = 0,
) -> None:
    """Is B better than A on the same questions? A paired comparison on the questions both scored: B − A,
    its paired-bootstrap 95% interval, a sign-flip permutation p-value and, for a 0/1 metric such as EM,
    the exact McNemar test. A table on stderr, one JSON object on stdout."""
    from rich.table import Table

    from ragrl.metrics.compare import pair_rows, paired_comparison, read_scored

    names = [m.strip() for m in metrics.split(",") if m.strip()]
    if not names:
        raise RagrlError("--metrics: name at least one metric (em, f1, ...)")
    a_path, a_rows = read_scored(a)
    b_path, b_rows = read_scored(b)
    result: dict = {"a": str(a_path), "b": str(b_path), "resamples": resamples, "seed": seed, "metrics": {}}
    left_out: dict[str, list[str]] = {}
    for name in names:
        xs, ys, left_out = pair_rows(a_rows, b_rows, name, (str(a_path), str(b_path)))
        if not xs:
            raise RagrlError(
                f"no question is scored on {name} by both {a_path} and {b_path} "
                f"(ids only in A: {len(left_out['a_only'])}, only in B: {len(left_out['b_only'])})"
            )
        stats = paired_comparison(xs, ys, resamples=resamples, seed=seed)
        stats["unscored"] = {"count": len(left_out["unscored"]), "first_ids": left_out["unscored"][:10]}
        result["metrics"][name] = stats
    result["a_only"] = {"count": len(left_out["a_only"]), "first_ids": left_out["a_only"][:10]}
    result["b_only"] = {"count": len(left_out["b_only"]), "first_ids": left_out["b_only"][:10]}

    def p_text(p: float) -> str:
        return f"{p:.4f}" if p >= 0.001 else f"{p:.1e}"

    floor = f"≤ {p_text(1 / (1 + resamples))}"  # no sign flip was as extreme: the resamples' floor
    table = Table("metric", "n", "A", "B", "B − A", "95% interval", "p", "McNemar (B only / A only, p)")
    for name, s in result["metrics"].items():
        mc = s.get("mcnemar")
        mcnemar = f"{mc['b_only']} / {mc['a_only']}, {p_text(mc['p_value'])}" if mc else "—"
        lo, hi = s["ci95"]
        table.add_row(
            name, str(s["n"]), f"{s['a']:.4f}", f"{s['b']:.4f}", f"{s['delta']:+.4f}",
            f"[{lo:+.4f}, {hi:+.4f}]", floor if s["p_value"] == 1 / (1 + resamples) else p_text(s["p_value"]),
            mcnemar,
        )  # fmt: skip
    console.print(table)

    def warn(message: str) -> None:
        console.print(styled("warning:", "yellow", message))

    def questions(n: int) -> str:
        return f"{n} question{'s' if n != 1 else ''}"

    for key, where, other in (("a_only", a_path, b_path), ("b_only", b_path, a_path)):
        info = result[key]
        if info["count"]:
            first = ", ".join(info["first_ids"])
            warn(f"{questions(info['count'])} of {where} not in {other}: left out (first: {first})")
    for name, s in result["metrics"].items():
        if s["unscored"]["count"]:
            first = ", ".join(s["unscored"]["first_ids"])
            n = questions(s["unscored"]["count"])
            warn(f"{n} of both runs left out of {name}: one run has no {name} for them (first: {first})")
    first, second = _scored_from(a_path), _scored_from(b_path)
    same_file = (  # by content where both runs recorded it, else by path
        first["data_sha256"] == second["data_sha256"]
        if first.get("data_sha256") and second.get("data_sha256")
        else first.get("data") == second.get("data") or not (first.get("data") and second.get("data"))
    )
    if not same_file:
        by_content = (
            " (their sha256 differ)" if first.get("data_sha256") and second.get("data_sha256") else ""
        )
        warn(f"A and B scored other question files: {first.get('data')} and {second.get('data')}{by_content}")
    if first.get("variant") and second.get("variant") and first["variant"] != second["variant"]:
        warn(f"A and B scored with other normalizations: {first['variant']} and {second['variant']}")
    typer.echo(json.dumps(result, indent=2, ensure_ascii=False))
