"""The report of a training run: ``metrics.jsonl`` read back, plotted and summarised in ``report.md``.

A run folder holds ``metrics.jsonl``, one JSON object per line with ``kind`` ("train", "eval" or
"sft"), ``step`` and ``time``, plus the numbers of that kind (``reward``, ``reward/<component>``,
``loss``, ``kl``... for train; ``eval/em``, ``eval/f1``... for eval; ``loss``, ``lr``... for sft).
``write_report`` turns it into ``curves.png`` (reward and held-out EM against the step) and
``report.md`` (summary, eval table, last-step diagnostics, config link and a few sample trajectories).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from ragrl.data.io import iter_jsonl
from ragrl.errors import DataError
from ragrl.llm.environment import describe
from ragrl.rollout.records import read_trajectories
from ragrl.rollout.trajectory import Trajectory

# Summary keys shown first, in this order, with their labels; any other scalar key follows as is.
_SUMMARY_LABELS = {
    "method": "method",
    "model": "model",
    "seed": "seed",
    "processes": "processes",
    "steps": "steps",
    "n_eval": "held-out questions",
    "n_dev": "dev questions (ragrl demo: the evaluations and EM curve below; the summary rows are test)",
    "em_before": "EM before",
    "em_after": "EM after",
    "em_gain": "EM gain",
    "em_answerable_before": "EM before, answerable questions only",
    "em_answerable_after": "EM after, answerable questions only",
    "top_answer_after": "most common answer after",
    "top_answer_share_after": "its share of the answers",
    "wall_seconds": "wall time",
    "peak_memory_mb": "peak memory",
}


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl``; one that is not an object with ``kind`` and ``step`` raises."""
    records: list[dict[str, Any]] = []
    for line, record in iter_jsonl(path):
        if not isinstance(record, dict):
            raise DataError(f"expected a JSON object, got {type(record).__name__}", path=path, line=line)
        for key in ("kind", "step"):
            if key not in record:
                raise DataError("missing", path=path, line=line, field=key)
        records.append(record)
    return records


def plot_curves(records: list[dict[str, Any]], out_png: Path, title: str | None = None) -> Path:
    """Plot training reward (or SFT loss) and held-out EM against the step into ``out_png``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4), dpi=120)
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2)
    train = [r for r in records if r.get("kind") == "train"]
    sft = [r for r in records if r.get("kind") == "sft"]
    if _series(train, "reward")[0] or not _series(sft, "loss")[0]:
        _plot_reward(left, train)
    else:
        _plot_sft_loss(left, sft)
    _plot_eval(right, [r for r in records if r.get("kind") == "eval"])
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png)
    return out_png


def write_report(
    run_dir: Path,
    summary: dict[str, Any],
    *,
    config_name: str = "config.yaml",
    samples_name: str = "samples.jsonl",
    n_samples: int = 3,
) -> Path:
    """Write ``run_dir/curves.png`` and ``run_dir/report.md``; returns the path of the report."""
    run_dir = Path(run_dir)
    metrics_path = run_dir / "metrics.jsonl"
    records = read_metrics(metrics_path) if metrics_path.exists() else []
    out = [f"# Run report: {run_dir.name}", "", "## Summary", ""]
    out += _summary_table(summary)
    out += ["## Curves", ""]
    try:
        plot_curves(records, run_dir / "curves.png", title=str(summary.get("method") or run_dir.name))
        out += ["![curves](curves.png)", ""]
    except ImportError:
        out += ["_matplotlib is not installed, so there are no curves._", ""]
    out += _eval_table([r for r in records if r.get("kind") == "eval"])
    last = [r for r in records if r.get("kind") == "train"] or [r for r in records if r.get("kind") == "sft"]
    if last:
        out += [f"## Last training step (step {last[-1]['step']})", ""]
        numbers = [(k, v) for k, v in last[-1].items() if k not in ("kind", "step") and _is_number(v)]
        out += _table(["metric", "value"], [[k, f"{v:.4g}"] for k, v in numbers])
    if (run_dir / config_name).exists():
        out += ["## Config", "", f"Resolved config: [{config_name}]({config_name})", ""]
    out += _environment(run_dir / "environment.json")
    samples_path = run_dir / samples_name
    if samples_path.exists() and n_samples > 0:
        out += ["## Sample trajectories", ""]
        for i, traj in enumerate(read_trajectories(samples_path)[:n_samples], start=1):
            out += _sample(i, traj)
    report = run_dir / "report.md"
    report.write_text("\n".join(out), encoding="utf-8")
    return report


def _environment(path: Path) -> list[str]:
    """The report's lines on where the run ran: one per start (``ragrl.llm.environment``)."""
    if not path.exists():
        return []
    try:
        starts = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        return ["## Environment", "", f"_{path.name} is unreadable: {err}_", ""]
    if not isinstance(starts, list):
        return ["## Environment", "", f"_{path.name} is not a list of starts_", ""]
    lines = [f"- step {s.get('step')}: {describe(s)}" for s in starts if isinstance(s, dict)]
    return ["## Environment", "", *lines, "", f"Every installed package: [{path.name}]({path.name})", ""]


# -- plotting -------------------------------------------------------------------------------------


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _series(records: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """Steps and values of ``key`` over the records that have a finite number for it."""
    pairs = [(r["step"], float(r[key])) for r in records if _is_number(r.get(key))]
    return [s for s, _ in pairs], [v for _, v in pairs]


def _moving_average(values: list[float]) -> list[float]:
    """Trailing mean over a window of a tenth of the series (at least 1)."""
    w = max(1, len(values) // 10)
    return [sum(values[max(0, i - w + 1) : i + 1]) / (i + 1 - max(0, i - w + 1)) for i in range(len(values))]


def _no_data(ax: Any, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what} data", ha="center", va="center", transform=ax.transAxes, color="gray")
    ax.set_xticks([])
    ax.set_yticks([])


def _plot_reward(ax: Any, train: list[dict[str, Any]]) -> None:
    ax.set_title("training reward")
    steps, values = _series(train, "reward")
    if not steps:
        _no_data(ax, "reward")
        return
    ax.plot(steps, values, lw=0.8, alpha=0.35, color="C0", label="reward (per step)")
    ax.plot(steps, _moving_average(values), lw=2, color="C0", label="reward (moving avg)")
    components = sorted({k for r in train for k in r if k.startswith("reward/")})
    if len(components) >= 2:
        for i, key in enumerate(components, start=1):
            c_steps, c_values = _series(train, key)
            if c_steps:
                ax.plot(c_steps, _moving_average(c_values), lw=1.2, color=f"C{i}", label=key)
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("mean reward")
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3)


def _plot_sft_loss(ax: Any, sft: list[dict[str, Any]]) -> None:
    ax.set_title("SFT loss")
    steps, values = _series(sft, "loss")
    ax.plot(steps, values, lw=0.8, alpha=0.35, color="C0", label="loss (per step)")
    ax.plot(steps, _moving_average(values), lw=2, color="C0", label="loss (moving avg)")
    ax.set_xlabel("SFT step")
    ax.set_ylabel("loss")
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3)


def _plot_eval(ax: Any, evals: list[dict[str, Any]]) -> None:
    ax.set_title("held-out EM")
    steps, values = _series(evals, "eval/em")
    if not steps:
        _no_data(ax, "eval")
        return
    percents = [100 * v for v in values]
    ax.plot(steps, percents, marker="o", color="C1", label="EM")
    ax.axhline(percents[0], ls="--", color="gray", label=f"before ({percents[0]:.1f}%)")
    ax.set_xlabel("step")
    ax.set_ylabel("EM (%)")
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3)


# -- markdown -------------------------------------------------------------------------------------


def _cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines + [""]


_PERCENT_KEYS = (
    "em_before",
    "em_after",
    "em_answerable_before",
    "em_answerable_after",
    "top_answer_share_after",
)


def _percent(v: Any) -> str:
    return f"{100 * v:.1f}%" if _is_number(v) else "-"


def _format_summary(key: str, v: Any) -> str:
    if not _is_number(v):
        return str(v)
    if key in _PERCENT_KEYS:
        return _percent(v)
    if key == "em_gain":  # already in points
        return f"{v:+.1f} points"
    if key == "wall_seconds":
        return f"{v:.1f} s ({v / 60:.1f} min)"
    if key == "peak_memory_mb":
        return f"{v:.0f} MB"
    return str(v) if isinstance(v, int) else f"{v:.4g}"


def _summary_table(summary: dict[str, Any]) -> list[str]:
    scalars = {k: v for k, v in summary.items() if isinstance(v, str | int | float | bool)}
    keys = [k for k in _SUMMARY_LABELS if k in scalars] + [k for k in scalars if k not in _SUMMARY_LABELS]
    if not keys:
        return ["_No summary._", ""]
    return _table(["", "value"], [[_SUMMARY_LABELS.get(k, k), _format_summary(k, scalars[k])] for k in keys])


def _eval_table(evals: list[dict[str, Any]]) -> list[str]:
    lines = ["## Held-out evaluations", ""]
    if not evals:
        return lines + ["_No evaluations recorded._", ""]
    rows = [
        [
            str(r["step"]),
            str(r.get("phase", "-")),
            _percent(r.get("eval/em")),
            _percent(r.get("eval/f1")),
            _percent(r.get("eval/answer_rate")),
            f"{r['eval/searches']:.2f}" if _is_number(r.get("eval/searches")) else "-",
            str(r.get("eval/n", "-")),
        ]
        for r in evals
    ]
    return lines + _table(["step", "phase", "EM", "F1", "answer rate", "searches", "n"], rows)


def _sample(i: int, traj: Trajectory) -> list[str]:
    lines = [f"### Sample {i}: `{traj.example_id}`", ""]
    meta = [f"{k}={v:.4g}" if _is_number(v) else f"{k}={v}" for k, v in traj.metadata.items() if _scalar(v)]
    if meta:
        lines.append(f"- metadata: {', '.join(meta)}")
    answer = traj.final_answer if traj.final_answer is not None else "(none)"
    lines += [f"- final answer: {answer}", f"- finish reason: {traj.finish_reason or '-'}", ""]
    body: list[str] = []
    for seg in traj.segments:
        text = seg.text.strip("\n")
        if seg.kind == "env":
            body += ["> " + line for line in text.split("\n")]
        else:
            body += text.split("\n")
    text = "\n".join(body)
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return lines + [f"{fence}text", text, fence, ""]


def _scalar(v: Any) -> bool:
    return isinstance(v, int | float | bool) or (isinstance(v, str) and len(v) <= 80)
