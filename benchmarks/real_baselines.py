"""Real-data baselines of a pretrained policy: Search-R1 and ARENA on the shared multi-hop samples.

For each sample (HotpotQA, 2Wiki, MuSiQue, Bamboogle from ``../shared/data``, converted with ``ragrl data
convert``), a fixed seeded shuffle splits the questions into the ``--n`` evaluated ones and the rest (the
pool). Every row is ``ragrl eval`` of the policy, greedy:

* ``zero``: the method's prompt alone;
* ``few``: ``--few-shot``: the method's oracle answers the first pool questions through the real rollout,
  and those replies go in front of every prompt (``--shots``; never an evaluated question);
* ``sft``: after ``ragrl sft METHOD --demos oracle`` on the pooled pools of the samples with passages
  (one warm start per method; ``--sft-steps`` of ``--sft-batch`` demonstrations).

Search-R1 searches BM25 over the sample's own corpus (the passages given with its questions); Bamboogle
comes without passages, so it searches the pool of the other samples' corpora (which rarely holds its
facts: that row measures what the policy does without evidence), and its few-shot row shows shots from
the first sample with passages (whose searches find their evidence in that pool). ARENA reads the
passages given with each question, so it has no Bamboogle row. The search oracle on real data searches
the titles of the supporting passages (HotpotQA, 2Wiki) or the gold sub-questions (MuSiQue).

Rows already measured (their ``scores.json`` exists) are kept, so an interrupted run continues
(``--measured-only`` tabulates them and runs nothing). The table
(``table.md`` in ``--out``) lists EM / F1 / cover-EM, searches per question, answer rate, ARENA's
citation audit (cited = gold ids exactly) and the wall time of each row.

    make smollm2
    python benchmarks/real_baselines.py --model models/smollm2-135m-instruct --out runs/real [--n 100]

The table in ``docs/models.md`` is this script's defaults with ``--batch-size 100`` on one H100 (about 25
minutes); on 2 CPU cores the same run is many hours.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# the shared samples: ../shared/data beside the checkout, or RAGRL_SHARED_DATA (a GPU machine's copy)
SHARED = Path(
    os.environ.get("RAGRL_SHARED_DATA") or Path(__file__).resolve().parents[1].parent / "shared" / "data"
)
SAMPLES = {
    "hotpotqa": "hotpotqa/leeyeezeee__benchfortir/test.jsonl",
    "2wiki": "2wikimultihopqa/saptarshi059__TTS-project/sampled_ds.json",
    "musique": "musique/AdelWang__MIGRES/musique.json",
    "bamboogle": "bamboogle/LoganMilandin__comp-gap-public/bamboogle.json",
}
SETTINGS = ("zero", "few", "sft")
# the token budgets of every row (eval and SFT alike)
BUDGET = {
    # up to 4 searches (2Wiki's comparisons have 4 supporting titles) and an answer, 3 passages a search
    "search_r1": [
        "rollout.max_turns=6",
        "rollout.max_new_tokens=64",
        "rollout.max_total_tokens=1280",
        "rollout.max_obs_tokens=300",
    ],
    "arena": ["rollout.max_new_tokens=128", "rollout.max_total_tokens=128"],
}


def ragrl(*args: str, log: Path) -> float:
    """Run one ragrl command (its output to ``log``); returns its wall time. A failure stops the script."""
    return side_by_side([(list(args), log)])[0]


def side_by_side(commands: list[tuple[list[str], Path]], env: dict[str, str] | None = None) -> list[float]:
    """Run ragrl commands at the same time, each ``(args, log)``, in ``env`` (default: this process's);
    in order, the seconds until each was seen to end (it is waited for after the ones before it). A
    failure of any stops the script after all have ended (the failed ones named, with their logs); if
    this process is stopped first, the ones still running are killed."""
    t0 = time.perf_counter()
    procs: list[tuple[list[str], Path, Any, subprocess.Popen]] = []
    seconds, failed = [], []
    try:
        for args, log in commands:
            f = log.open("w")
            command = [sys.executable, "-m", "ragrl", *args]
            procs.append(
                (args, log, f, subprocess.Popen(command, stdout=f, stderr=subprocess.STDOUT, env=env))
            )
        for args, log, _, proc in procs:
            if proc.wait() != 0:
                failed.append(f"ragrl {' '.join(args[:2])} (exit {proc.returncode}; see {log})")
            seconds.append(time.perf_counter() - t0)
    finally:
        for _, _, f, proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            f.close()
    if failed:
        sys.exit("failed: " + "; ".join(failed))
    return seconds


def sets(items: list[str]) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


def prepare(sample: str, data: Path, n: int, seed: int) -> tuple[Path, Path]:
    """Convert the sample and split it: ``eval.jsonl`` (``n`` questions) and ``pool.jsonl`` (the rest).
    A folder split with another ``--n`` or ``--seed`` is refused, not reused."""
    d = data / sample
    split = {"n": n, "seed": seed}
    if (d / "split.json").is_file():
        if json.loads((d / "split.json").read_text()) != split:
            sys.exit(f"{d} was split with {(d / 'split.json').read_text().strip()}; use another --out")
        return d / "eval.jsonl", d / "pool.jsonl"
    ragrl("data", "convert", str(SHARED / SAMPLES[sample]), "--out", str(d), log=data / f"{sample}.log")
    lines = (d / "questions.jsonl").read_text(encoding="utf-8").splitlines()
    random.Random(seed).shuffle(lines)
    (d / "eval.jsonl").write_text("\n".join(lines[:n]) + "\n", encoding="utf-8")
    (d / "pool.jsonl").write_text("\n".join(lines[n:]) + "\n", encoding="utf-8")
    (d / "split.json").write_text(json.dumps(split) + "\n")
    return d / "eval.jsonl", d / "pool.jsonl"


def build_index(corpora: list[Path], out: Path) -> Path:
    """A BM25 index over the passages of ``corpora`` (the first copy of a passage id wins)."""
    if (out / "bm25").is_dir():
        return out / "bm25"
    seen: set[str] = set()
    lines: list[str] = []
    for corpus in corpora:
        for line in corpus.read_text(encoding="utf-8").splitlines():
            pid = json.loads(line)["id"]
            if pid not in seen:
                seen.add(pid)
                lines.append(line)
    out.mkdir(parents=True, exist_ok=True)
    (out / "corpus.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    ragrl("index", str(out / "corpus.jsonl"), "--out", str(out / "bm25"), log=out / "index.log")
    return out / "bm25"


def warm_start(
    method: str, model: Path, pool: Path, index: Path, out: Path, args: argparse.Namespace
) -> Path:
    """``ragrl sft METHOD --demos oracle`` on the pooled questions; returns the policy folder."""
    run = out / f"sft-{method}"
    if not (run / "policy").is_dir():
        overrides = [
            f"train.model.path={model}",
            f"train.data.train={pool}",
            f"train.data.index={index}",
            "train.data.eval=null",
            "train.eval_every=0",
            f"train.sft.max_steps={args.sft_steps}",
            f"train.sft.batch_size={args.sft_batch}",
            f"train.sft.lr={args.sft_lr}",
            *BUDGET[method],
        ]
        seconds = ragrl(
            "sft",
            method,
            "--demos",
            "oracle",
            "--out",
            str(run),
            *sets(overrides),
            log=out / f"sft-{method}.log",
        )
        (run / "wall_seconds").write_text(f"{seconds:.0f}\n")
    return run / "policy"


def evaluate(
    row: dict, model: Path, questions: Path, index: Path | None, pool: Path, args: argparse.Namespace
) -> dict:
    """One row: ``ragrl eval`` (kept if already measured); returns the row with its figures."""
    out = args.out / "eval" / f"{row['sample']}-{row['method']}-{row['setting']}"
    if not (out / "scores.json").is_file():
        command = ["eval", "--method", row["method"], "--model", str(model), "--data", str(questions)]
        # --force: a row without scores.json never finished (an evaluation writes it with the rest)
        command += [
            "--out",
            str(out),
            "--force",
            "--batch-size",
            str(args.batch_size),
            *sets(BUDGET[row["method"]]),
        ]
        if index is not None and row["method"] == "search_r1":
            command += ["--index", str(index)]
        if row["setting"] == "few":
            command += ["--few-shot", str(pool), "--shots", str(args.shots[row["method"]])]
        seconds = ragrl(*command, log=args.out / "eval" / f"{out.name}.log")
        (out / "wall_seconds").write_text(f"{seconds:.0f}\n")
    scores = json.loads((out / "scores.json").read_text())
    wall = out / "wall_seconds"  # missing if a run stopped between the two writes
    keys = ("em", "f1", "cover_em", "searches_per_question", "answer_rate", "cite/equal", "n_scored")
    return {
        **row,
        **{k: scores.get(k) for k in keys},
        "seconds": float(wall.read_text()) if wall.is_file() else float("nan"),
    }


def table(rows: list[dict]) -> str:
    columns = ["sample", "method", "setting", "n", "EM", "F1", "cover-EM", "searches / q", "answer rate"]
    columns += ["cited = gold", "wall"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        cells = [r["sample"], r["method"], r["setting"], str(r["n_scored"])]
        for k in ("em", "f1", "cover_em", "searches_per_question", "answer_rate", "cite/equal"):
            cells.append(
                "-" if r.get(k) is None else f"{r[k]:.3f}" if k != "searches_per_question" else f"{r[k]:.2f}"
            )
        cells.append(f"{r['seconds']:.0f} s")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=Path("models/smollm2-135m-instruct"))
    p.add_argument("--out", type=Path, default=Path("runs/real-baselines"))
    p.add_argument("--n", type=int, default=100, help="evaluated questions per sample")
    p.add_argument("--samples", nargs="+", default=list(SAMPLES), choices=list(SAMPLES))
    p.add_argument("--methods", nargs="+", default=["search_r1", "arena"], choices=["search_r1", "arena"])
    p.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=SETTINGS)
    p.add_argument("--sft-steps", type=int, default=100)
    p.add_argument("--sft-batch", type=int, default=16)
    p.add_argument("--sft-lr", type=float, default=2e-5)
    p.add_argument("--sft-questions", type=int, default=200, help="pool questions per sample for the SFT")
    p.add_argument("--batch-size", type=int, default=32, help="generation batch size")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--measured-only", action="store_true", help="tabulate the rows already measured; run none"
    )
    args = p.parse_args()
    if not args.model.is_dir():
        sys.exit(f"{args.model}: no model folder (make smollm2)")
    args.shots = {"search_r1": 2, "arena": 1}  # ARENA's prompt carries every given passage: one shot
    data = args.out / "data"
    data.mkdir(parents=True, exist_ok=True)
    (args.out / "eval").mkdir(exist_ok=True)
    t0 = time.perf_counter()

    split = {s: prepare(s, data, args.n, args.seed) for s in args.samples}
    with_passages = [s for s in args.samples if (data / s / "corpus.jsonl").is_file()]
    index = {s: build_index([data / s / "corpus.jsonl"], data / s) for s in with_passages}
    pooled = build_index([data / s / "corpus.jsonl" for s in with_passages], data / "pooled")
    for s in args.samples:
        index.setdefault(s, pooled)

    policy = {m: args.model for m in args.methods}
    if "sft" in args.settings and not args.measured_only:
        sft_pool = data / "sft-pool.jsonl"
        lines = [
            ln for s in with_passages for ln in split[s][1].read_text().splitlines()[: args.sft_questions]
        ]
        sft_pool.write_text("\n".join(lines) + "\n", encoding="utf-8")
        policy = {m: warm_start(m, args.model, sft_pool, pooled, args.out, args) for m in args.methods}

    rows = []
    for s in args.samples:
        questions, pool = split[s]
        if s not in with_passages and with_passages:  # shots whose searches find their evidence
            pool = split[with_passages[0]][1]
        for m in args.methods:
            if m == "arena" and s not in with_passages:
                continue  # ARENA reads given passages; this sample has none
            for setting in args.settings:
                measured = (args.out / "eval" / f"{s}-{m}-{setting}" / "scores.json").is_file()
                if args.measured_only and not measured:
                    continue
                model = policy[m] if setting == "sft" else args.model
                row = evaluate(
                    {"sample": s, "method": m, "setting": setting}, model, questions, index[s], pool, args
                )
                rows.append(row)
                print(json.dumps(row), flush=True)
    text = table(rows)
    (args.out / "table.md").write_text(text + "\n", encoding="utf-8")
    print(text)
    print(f"total wall time {time.perf_counter() - t0:.0f} s (rows measured earlier count their own time)")


if __name__ == "__main__":
    main()
