"""Does the demo learn? Warm-start vs after-GRPO held-out EM of ``ragrl demo`` over several seeds.

Runs the whole demo (world, the reader base or a tiny policy built from scratch, SFT warm start, GRPO,
held-out evaluation) once per seed and prints, per seed: test EM on the answerable questions of the
warm start and after GRPO with the gain in points, the same final policy closed-book (every search
finds nothing: what it answers without reading), the heuristic demonstrator, the most common answer's
share (collapse check), wall time and peak memory. The last line is the mean over the seeds of the
final policy's answerable EM and of its gain (the learning issue's bars: >= 0.65 on average and
>= 0.55 on every seed; >= +10 points on average and >= +5 on every seed).

    python benchmarks/demo_learning.py --seeds 0 1 2 [--base shipped|scratch|DIR] [--split facts|entities]
        [--workdir DIR] [--set k=v]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from ragrl.synth.world import DEFAULT_SPLIT_MODE
from ragrl.train.demo import DEFAULT_COPY_STEPS, run_demo, sft_control
from ragrl.train.reader import resolve_base


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--split", default=DEFAULT_SPLIT_MODE, help="world split: facts (default) or entities"
    )
    parser.add_argument("--copy-steps", type=int, default=DEFAULT_COPY_STEPS)
    parser.add_argument(
        "--base", default="shipped", help="shipped (the reader base), scratch (the earlier demo) or a folder"
    )
    parser.add_argument(
        "--warm-start", action=argparse.BooleanOptionalAction, default=True,
        help="the SFT warm start before GRPO (--no-warm-start: GRPO from the base as it is)",
    )  # fmt: skip
    parser.add_argument(
        "--sft-control",
        action="store_true",
        help="also train each warm start with SFT alone for the RL stage's wall time, and evaluate it",
    )
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="config override")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="ragrl-demo-learning-"))
    base = resolve_base(args.base)

    gains, finals, walls, peaks, over_sft = [], [], [], [], []
    for seed in args.seeds:
        s = run_demo(
            workdir / f"seed-{seed}", seed=seed, split=args.split, base=base, copy_steps=args.copy_steps,
            warm_start=args.warm_start, overrides=args.overrides, force=True,
        )  # fmt: skip
        gain = 100 * (s["em_answerable_after"] - s["em_answerable_before"])
        gains.append(gain)
        finals.append(s["em_answerable_after"])
        walls.append(s["wall_seconds"])
        peaks.append(s["peak_memory_mb"])
        print(
            f"seed {seed} ({args.split} split): answerable EM warm start "
            f"{s['em_answerable_before']:.3f} -> after GRPO {s['em_answerable_after']:.3f} "
            f"({gain:+.1f} points); closed-book {s['em_answerable_closed_book']:.3f}; "
            f"heuristic demonstrator {s['em_answerable_heuristic']:.3f}; all questions "
            f"{s['em_before']:.3f} -> {s['em_after']:.3f} ({s['n_eval']}); most common answer "
            f"{s['top_answer_after']!r} ({100 * s['top_answer_share_after']:.0f}%); "
            f"{s['wall_seconds']:.0f} s, peak {s['peak_memory_mb']:.0f} MB",
            flush=True,
        )
        if args.sft_control:
            c = sft_control(workdir / f"seed-{seed}", s["rl_seconds"], overrides=args.overrides)
            over_sft.append(100 * (s["em_answerable_after"] - c["em_answerable"]))
            print(
                f"seed {seed} SFT-only control: {c['steps']} more SFT steps ({c['seconds']:.0f} s against "
                f"RL's {s['rl_seconds']:.0f} s): answerable EM {c['em_answerable']:.3f}; RL "
                f"{s['em_answerable_after']:.3f} ({over_sft[-1]:+.1f} points over SFT)",
                flush=True,
            )
    if over_sft:
        print(f"mean RL gain over the SFT-only control: {statistics.mean(over_sft):+.1f} points")
    print(
        f"wall time per seed: mean {statistics.mean(walls):.0f} s, max {max(walls):.0f} s; "
        f"peak {max(peaks):.0f} MB"
    )
    print(
        f"over {len(gains)} seeds: held-out answerable EM after GRPO {statistics.mean(finals):.3f} on the "
        f"mean (min {min(finals):.3f}); gain over the warm start {statistics.mean(gains):+.1f} points "
        f"(min {min(gains):+.1f})"
    )


if __name__ == "__main__":
    main()
