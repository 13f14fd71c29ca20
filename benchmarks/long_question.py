"""A 1 MB question costs what any question costs: ``ragrl eval`` end to end on three questions, and on
the same three with the middle one's text replaced by a megabyte (``"Who? " + "x " * 500_000``).

    .venv/bin/python benchmarks/long_question.py [--repeats 3] [--workdir DIR]

The work folder holds a synthetic world (seed 3, small, entity split), its BM25 index and a tiny policy
(hidden 64, 2 layers), as the eval CLI tests build them. Each run is ``ragrl eval`` in its own process
(the question file read, the model and index loaded, the questions decoded and scored), the two files
interleaved, best of ``--repeats``; the long file's run must report the question cut
(``rollout.max_question_chars``) and score all three. The last line printed is the ratio of the long
file's wall time to the short one's.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RAGRL = [sys.executable, "-m", "ragrl"]


def ragrl(*args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([*RAGRL, *args], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"ragrl {' '.join(args)} failed:\n{done.stderr[-2000:]}")
    return done


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workdir", type=Path, default=None, help="keep the world, index and model here")
    args = ap.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="long-question-"))
    world = work / "world"
    if not (world / "model" / "config.json").is_file():
        ragrl("data", "synth", "--seed", "3", "--size", "small", "--split", "entities", "--out", str(world))
        ragrl("index", str(world / "corpus.jsonl"), "--out", str(world / "bm25"))
        ragrl(
            "model",
            "tiny",
            "--data",
            str(world),
            "--out",
            str(world / "model"),
            "--hidden",
            "64",
            "--layers",
            "2",
        )

    lines = (world / "test.jsonl").read_text(encoding="utf-8").splitlines()[:3]
    record = json.loads(lines[1])
    record["question"] = "Who? " + "x " * 500_000
    files = {"short": work / "short.jsonl", "long": work / "long.jsonl"}
    files["short"].write_text("\n".join(lines) + "\n", encoding="utf-8")
    files["long"].write_text("\n".join([lines[0], json.dumps(record), lines[2]]) + "\n", encoding="utf-8")
    print(f"questions: 3; the long file's second question has {len(record['question']):,} characters")

    times: dict[str, list[float]] = {"short": [], "long": []}
    for repeat in range(args.repeats):
        for name, path in files.items():
            out = work / f"eval-{name}-{repeat}"
            t0 = time.perf_counter()
            ragrl("eval", "--model", str(world / "model"), "--data", str(path),
                  "--index", str(world / "bm25"), "--out", str(out), "--force")  # fmt: skip
            times[name].append(time.perf_counter() - t0)
            scores = json.loads((out / "scores.json").read_text(encoding="utf-8"))
            if scores["n_scored"] != 3 or scores.get("questions_cut", 0) != (name == "long"):
                sys.exit(f"{name}: expected 3 questions scored, {int(name == 'long')} cut: {scores}")
    for name, seconds in times.items():
        print(
            f"{name}: best {min(seconds):.2f} s of {', '.join(f'{s:.2f}' for s in seconds)} "
            "(ragrl eval, 3 questions)"
        )
    print(f"long / short wall-time ratio: {min(times['long']) / min(times['short']):.2f}")


if __name__ == "__main__":
    main()
