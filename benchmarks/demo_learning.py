"""Does the demo learn? Warm-start vs after-GRPO held-out EM of ``ragrl demo`` over several seeds.

Runs the whole demo (world, tiny policy, SFT warm start, GRPO, held-out evaluation) once per seed and
prints, per seed, the held-out EM of the warm start and after GRPO, the gain in points and the wall
time; the last line is the mean gain over the seeds (the issue's target: >= 10 points).

    python benchmarks/demo_learning.py --seeds 0 1 2 [--workdir runs/demo-learning] [--set key=value ...]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from ragrl.train.demo import run_demo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="config override")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="ragrl-demo-learning-"))

    gains, walls = [], []
    for seed in args.seeds:
        s = run_demo(workdir / f"seed-{seed}", seed=seed, overrides=args.overrides, force=True)
        gain = 100 * (s["em_after"] - s["em_before"])
        gains.append(gain)
        walls.append(s["wall_seconds"])
        print(
            f"seed {seed}: held-out EM warm start {s['em_before']:.3f} -> after GRPO {s['em_after']:.3f} "
            f"({gain:+.1f} points, {s['n_eval']} questions); answerable only {s['em_answerable_before']:.3f} "
            f"-> {s['em_answerable_after']:.3f}; most common answer {s['top_answer_after']!r} "
            f"({100 * s['top_answer_share_after']:.0f}%); {s['wall_seconds']:.0f} s, "
            f"peak {s['peak_memory_mb']:.0f} MB",
            flush=True,
        )
    print(f"wall time per seed: mean {statistics.mean(walls):.0f} s, max {max(walls):.0f} s")
    print(f"mean held-out EM gain over {len(gains)} seeds: {statistics.mean(gains):+.1f} points")


if __name__ == "__main__":
    main()
