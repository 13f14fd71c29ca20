"""The command line's start: ``ragrl --version`` in a fresh process against the same process made to
import the methods first (what every ``ragrl`` command imported at its start before the help's list of
configs was read from their folder; the methods import torch).

    .venv/bin/python benchmarks/cli_startup.py [--repeats 5]

Both are timed interleaved, best of N, wall clock of the whole process. The last line printed is the
ratio of the two.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

CLI = "import sys; sys.argv = ['ragrl', '--version']; from ragrl.cli import main; main()"
WITH_METHODS = "import ragrl.methods; " + CLI


def once(code: str) -> float:
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    seconds = time.perf_counter() - t0
    if done.returncode != 0 or not done.stdout.startswith("ragrl "):
        sys.exit(f"`{code}` failed: {done.stdout[-500:]}{done.stderr[-2000:]}")
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    times: dict[str, list[float]] = {"cli": [], "with_methods": []}
    for code in (CLI, WITH_METHODS):  # warm the file cache for both
        once(code)
    for _ in range(args.repeats):
        times["cli"].append(once(CLI))
        times["with_methods"].append(once(WITH_METHODS))
    best = {name: min(t) for name, t in times.items()}
    print(f"ragrl --version:                        {best['cli']:.2f} s  (best of {args.repeats})")
    print(f"ragrl --version, the methods imported:  {best['with_methods']:.2f} s  (best of {args.repeats})")
    print(f"start time ratio, now / with the methods: {best['cli'] / best['with_methods']:.2f}")


if __name__ == "__main__":
    main()
