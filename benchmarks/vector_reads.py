"""Reading re-ranking candidates from ``vectors.f32``: ``VectorFile.take`` (one ``os.preadv`` a row,
straight into the output array) against the way it read before (one ``os.pread`` a row, then a copy
out of the returned bytes), the same random rows, in the same run.

    .venv/bin/python benchmarks/vector_reads.py --vectors runs/retrieval-minilm-300k-v2/ivf-pq/vectors.f32
    .venv/bin/python benchmarks/vector_reads.py --rows 300000     # a random file of that many rows

The rows come from the page cache after a warm-up read of each, as in a server that has been running
a while. Prints microseconds a row for each and, last, the ratio pread ÷ preadv.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from ragrl.retrieval.embeddings import VectorFile


def pread_and_copy(vectors: VectorFile, ids: np.ndarray) -> np.ndarray:
    """The baseline, ``take`` as it was (bd8dfcf): ``VectorFile._read`` a row (one ``pread`` into new
    bytes, the open file looked up and the length checked), then copied into the output."""
    out = np.empty((len(ids), vectors.dim), dtype=np.float32)
    size = vectors.dim * 4
    for j, i in enumerate(ids.tolist()):
        out[j] = np.frombuffer(vectors._read(size, i * size), dtype=np.float32)
    return out


def per_row_us(read, vectors: VectorFile, ids: np.ndarray, repeats: int) -> float:
    read(vectors, ids)  # warm-up: the rows are in the page cache from here on
    t0 = time.perf_counter()
    for _ in range(repeats):
        read(vectors, ids)
    return (time.perf_counter() - t0) / repeats / len(ids) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vectors", type=Path, default=None, help="a vectors.f32 (default: a random file)")
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--rows", type=int, default=300_000, help="rows of the random file")
    ap.add_argument("--ids", type=int, default=12_800, help="rows read a repeat (32 queries × 400)")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.vectors
        if path is None:
            path = Path(tmp) / "vectors.f32"
            rng = np.random.default_rng(0)
            with path.open("wb") as f:
                for start in range(0, args.rows, 65_536):
                    n = min(65_536, args.rows - start)
                    f.write(rng.standard_normal((n, args.dim), dtype=np.float32).tobytes())
        rows = path.stat().st_size // (args.dim * 4)
        vectors = VectorFile(path, args.dim, rows)
        ids = np.random.default_rng(1).integers(0, rows, size=args.ids)
        if not np.array_equal(vectors.take(ids), pread_and_copy(vectors, ids)):
            raise SystemExit("the two reads disagree")
        before = per_row_us(pread_and_copy, vectors, ids, args.repeats)
        now = per_row_us(lambda v, i: v.take(i), vectors, ids, args.repeats)
        vectors.close()
    print(f"{rows:,} rows of {args.dim} float32, {args.ids:,} random rows a read, {args.repeats} reads")
    print(f"pread + copy (before): {before:.2f} µs a row")
    print(f"VectorFile.take (preadv into place): {now:.2f} µs a row")
    print(f"pread ÷ preadv: {before / now:.2f}")


if __name__ == "__main__":
    main()
