"""Retrieval at scale on this machine: a synthetic corpus of N passages, an IVF-PQ index built in
bounded memory, its speed and recall against exact search, and ``ragrl serve`` under 20 clients.

    .venv/bin/python benchmarks/retrieval_scale.py --passages 2000000 --workdir runs/retrieval-scale
    .venv/bin/python benchmarks/retrieval_scale.py --passages 300000 --model minilm --max-length 64 \
        --words 30 --sweep --workdir runs/retrieval-minilm    # recall and speed with the real encoder

Every step runs the real command in its own process and records its wall time and peak RSS (the
kernel's ``ru_maxrss`` of that process, from ``os.wait4``):

1. ``ragrl data synth-corpus -n N`` (``ragrl.synth.scale``: ~100-word passages on 2,000 topics);
2. ``ragrl index --retriever dense --model hashing:384 --index-type ivf-pq --recall-check 200``: by
   default the cheap deterministic hashing encoder, MiniLM's 384 dimensions (MiniLM embeds ~25
   synthetic 100-word passages a second here, so 2M would take a day); ``--model minilm`` is the real
   one, for recall, with ``--max-length`` and ``--words`` to keep its encoding affordable; with
   ``--bm25``, also ``ragrl index
   --retriever bm25`` over the same corpus (built in chunks: ``ragrl.retrieval.bm25_build``) and a
   hybrid index of the two;
3. queries/s at batch 32 of the IVF-PQ index (with its exact re-ranking) and of an exact flat index over
   the same vectors (``vectors.f32`` read into ``IndexFlatIP`` here), the same 320 queries (the first
   sentences of random passages, encoded once; ``--query-seed`` draws other passages, for a check on
   queries the defaults were not chosen on), and recall@10 of the IVF-PQ index against the flat one;
4. ``ragrl serve`` over the IVF-PQ index (and, with ``--bm25``, over a hybrid index holding both the
   BM25 and the IVF-PQ index): its RSS once loaded and after 20 concurrent clients sent 20 requests of
   8 queries each, their errors and latencies;
5. bytes a passage of each file of the index, and the projection to 21M passages of e5-base (768-d).

Steps whose output is already in ``--workdir`` are reused. Prints one table (markdown); the last line
is the queries/s ratio IVF-PQ ÷ flat.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from server_fairness import free_port, wait_for_health  # noqa: E402
from tiny_setup import open_workdir  # noqa: E402

from ragrl.retrieval.ann import probe_queries  # noqa: E402

RAGRL = [sys.executable, "-m", "ragrl"]


def run(command: list[str], log: Path) -> dict[str, Any]:
    """Run ``command`` (its output in ``log``); its wall seconds and peak RSS in MB. A failure exits."""
    t0 = time.perf_counter()
    with log.open("w") as f:
        proc = subprocess.Popen(command, stdout=f, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({proc.returncode}); see {log}:\n{log.read_text()[-2000:]}")
    return {"seconds": round(time.perf_counter() - t0, 1), "peak_rss_mb": round(usage.ru_maxrss / 1024)}


def step(name: str, done: Path, command: list[str], workdir: Path, record: dict[str, Any]) -> None:
    """One recorded step, skipped when ``done`` exists and the record has it (``steps.json``)."""
    if done.exists() and name in record:
        print(f"{name}: reused ({record[name]})", flush=True)
        return
    print(f"{name}: {' '.join(command[2:])}", flush=True)
    record[name] = run(command, workdir / f"{name}.log")
    (workdir / "steps.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(f"{name}: {record[name]}", flush=True)


def timed(search: Any, emb: np.ndarray, batch: int) -> tuple[list[list[int]], float]:
    """``search`` over ``emb`` a batch at a time, after one warm-up batch: the ids found, queries/s."""
    search(emb[:batch])
    t0 = time.perf_counter()
    found = [ids for s in range(0, len(emb), batch) for ids in search(emb[s : s + batch])]
    return found, len(emb) / (time.perf_counter() - t0)


def recall_at_10(found: list[list[int]], exact: list[list[int]]) -> float:
    return statistics.mean(len(set(a) & set(e)) / 10 for a, e in zip(found, exact, strict=True))


def ids_of(retriever: Any) -> Any:
    """A search over query embeddings through ``retriever.search_vectors``: its top 10 ids."""
    return lambda e: [[i for i, _ in row] for row in retriever.search_vectors(e, 10)]


def speed(index_dir: Path, n_queries: int, batch: int, seed: int = 0) -> dict[str, Any]:
    """Queries/s at ``batch`` of the index and of an exact flat index over its vectors; recall@10."""
    import faiss

    from ragrl.retrieval.base import load_retriever

    dense = load_retriever(index_dir, device="cpu")
    emb = dense.encode_queries(probe_queries(dense.passages, n_queries, seed=seed))
    flat = faiss.IndexFlatIP(dense.dim)
    for _, block in dense.vectors.blocks():
        flat.add(np.ascontiguousarray(block))
    out: dict[str, Any] = {"queries": n_queries, "query_seed": seed, "batch": batch}
    out["threads"] = faiss.omp_get_max_threads()
    found: dict[str, list[list[int]]] = {}
    for name, search in (("ivf_pq", ids_of(dense)), ("flat", lambda e: flat.search(e, 10)[1].tolist())):
        found[name], qps = timed(search, emb, batch)
        out[f"{name}_qps"] = round(qps, 1)
    out["recall@10"] = round(recall_at_10(found["ivf_pq"], found["flat"]), 4)
    out["ratio"] = round(out["ivf_pq_qps"] / out["flat_qps"], 1)
    out["flat_index_mb"] = round(flat.ntotal * dense.dim * 4 / 2**20)
    return out


SWEEP = [
    ("built", {"nprobe": 64, "rerank": 10}),
    ("previous", {"nprobe": 512, "rerank": 40}),
    ("default", {"nprobe": 128, "rerank": 10}), ("default", {"nprobe": 256, "rerank": 10}),
    ("default", {"nprobe": 512, "rerank": 5}), ("default", {"nprobe": 512, "rerank": 10}),
    ("default", {"nprobe": 512, "rerank": 20}), ("default", {"nprobe": 1024, "rerank": 10}),
    ("HNSW32", {"ef_search": 128}), ("HNSW32", {"ef_search": 320}), ("HNSW32", {"ef_search": 512}),
]  # fmt: skip
"""The settings ``--sweep`` measures: ``built`` is the index in the work folder (built by ``ragrl index``
with the defaults of its day), ``default`` today's ``--index-type ivf-pq`` spec, ``previous`` the
default before it (half as many 4-bit codes: ``PQ{dim/4}x4fsr``, then searched at nprobe 512 and
re-ranking 40 × k) and ``HNSW32``, all but ``built`` built here from the same vectors."""


def sweep(index_dir: Path, n_queries: int, batch: int, seed: int = 0) -> list[dict[str, Any]]:
    """Recall@10 against exact search and queries/s at ``batch`` of the built index at other search
    settings, and of today's default IVF-PQ spec, the previous one and an HNSW32 index built from the
    same vectors (``vectors.f32``: nothing is encoded again), all searched through
    ``DenseRetriever.search_vectors``; flat is measured in the same run."""
    import faiss

    from ragrl.retrieval import ann
    from ragrl.retrieval.base import load_retriever
    from ragrl.retrieval.dense import DenseRetriever

    base = load_retriever(index_dir, device="cpu")
    emb = base.encode_queries(probe_queries(base.passages, n_queries, seed=seed))
    blocks = [np.ascontiguousarray(block) for _, block in base.vectors.blocks()]
    n = sum(len(b) for b in blocks)
    flat = faiss.IndexFlatIP(base.dim)
    for block in blocks:
        flat.add(block)
    spec = ann.default_spec("ivf-pq", n, base.dim)
    m = next(m for m in (base.dim // 4, base.dim // 2, base.dim) if m >= 1 and base.dim % m == 0)
    specs = {"default": spec, "previous": f"IVF{ann.nlist_of(spec)},PQ{m}x4fsr", "HNSW32": "HNSW32"}
    indexes = {
        kind: ann.build_from_shards(faiss, name, base.dim, [lambda b=b: b for b in blocks], total=n)[0]
        for kind, name in specs.items()
    }
    del blocks

    exact, flat_qps = timed(lambda e: flat.search(e, 10)[1].tolist(), emb, batch)
    rows = []
    for kind, settings in SWEEP:
        if kind == "built":
            r = load_retriever(index_dir, device="cpu", **settings)
        else:
            r = DenseRetriever(base.encoder, indexes[kind], base.passages, model=base.model, spec=specs[kind],
                               max_length=base.max_length, vectors=base.vectors, **settings)  # fmt: skip
        found, qps = timed(ids_of(r), emb, batch)
        recall = recall_at_10(found, exact)
        rows.append({"index": r.spec, **settings, "recall@10": round(recall, 3), "qps": round(qps),
                     "ratio": round(qps / flat_qps, 1), "flat_qps": round(flat_qps)})  # fmt: skip
    return rows


def rss_mb(pid: int) -> dict[str, int]:
    """The process's resident set now and at its peak (``/proc/PID/status``), in MB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = round(int(value.split()[0]) / 1024)
    return {"rss_mb": fields["VmRSS"], "peak_rss_mb": fields["VmHWM"]}


def serve(index_dir: Path, queries: list[str], clients: int, requests: int, per_request: int) -> dict:
    """``ragrl serve`` over ``index_dir``; ``clients`` threads each sending ``requests`` requests."""
    import httpx

    port = free_port()
    server = subprocess.Popen(
        [*RAGRL, "serve", str(index_dir), "--port", str(port), "--device", "cpu"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        loaded = {"load_seconds": round(wait_for_health(url, server), 1), **rss_mb(server.pid)}
        errors, latencies = [], []
        lock = threading.Lock()

        def client(c: int) -> None:
            rng = random.Random(c)
            with httpx.Client(timeout=120) as http:
                for _ in range(requests):
                    body = {"queries": rng.sample(queries, per_request), "topk": 5, "return_scores": True}
                    t = time.perf_counter()
                    try:
                        r = http.post(f"{url}/retrieve", json=body)
                        ok = r.status_code == 200 and len(r.json()["result"]) == per_request
                    except httpx.HTTPError as e:
                        ok, r = False, e
                    with lock:
                        latencies.append(time.perf_counter() - t)
                        if not ok:
                            errors.append(str(r)[:200])

        threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
        t1 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t1
        after = rss_mb(server.pid)
    finally:
        server.terminate()
        server.wait(timeout=60)
    latencies.sort()
    return {
        "loaded": loaded, "after": after, "clients": clients, "requests": clients * requests,
        "queries_per_request": per_request, "errors": len(errors), "first_errors": errors[:3],
        "p50_s": round(latencies[len(latencies) // 2], 3),
        "p99_s": round(latencies[int(len(latencies) * 0.99)], 3),
        "queries_per_s": round(clients * requests * per_request / wall, 1),
    }  # fmt: skip


def sizes(index_dir: Path, n: int) -> dict[str, float]:
    """Bytes a passage of each file of the index."""
    return {p.name: round(p.stat().st_size / n, 1) for p in sorted(index_dir.iterdir()) if p.is_file()}


def projection(n: int = 21_000_000, dim: int = 768) -> list[tuple[str, float]]:
    """Bytes of each index type for ``n`` passages of ``dim`` dimensions, from faiss's layouts: a flat
    index stores 4·dim bytes a vector; HNSW32 that and 2·32 int32 links on level 0 (upper levels add
    ~1/32 of that); IVF-PQ its default spec's 4-bit codes (dim/2 of them: dim/4 bytes) and an 8-byte id
    a vector, plus the coarse centroids (the fast-scan layout's padding of each list to a block of 32 is
    left out: < 0.1 GB)."""
    import re

    from ragrl.retrieval import ann

    spec = ann.default_spec("ivf-pq", n, dim)
    codes = re.search(r"PQ(\d+)x4", spec)
    nlist, m = ann.nlist_of(spec), int(codes[1]) // 2
    return [
        ("flat (IndexFlatIP, in memory)", n * dim * 4),
        ("hnsw (HNSW32, in memory)", n * (dim * 4 + 2 * 32 * 4 * (1 + 1 / 32))),
        (f"ivf-pq ({spec}, in memory)", n * (m + 8) + nlist * dim * 4),
        ("ivf-pq's vectors.f32 (on disk, read by row for re-ranking)", n * dim * 4),
        ("corpus offsets (in memory)", n * 8),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--passages", type=int, default=2_000_000)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument(
        "--bm25", action="store_true", help="also build a BM25 index (in chunks) and a hybrid of both"
    )
    ap.add_argument(
        "--model", default="hashing:384", help="hashing:384 (the scale run) or minilm (the bundled encoder)"
    )
    ap.add_argument("--max-length", type=int, default=None, help="tokens a passage and a query are cut to")
    ap.add_argument("--words", type=int, default=100, help="words a synthetic passage, on average")
    ap.add_argument(
        "--sweep",
        action="store_true",
        help="also recall and speed at other settings, today's and the previous default IVF-PQ and HNSW32 "
        "(same vectors)",
    )
    ap.add_argument("--queries", type=int, default=320)
    ap.add_argument(
        "--query-seed",
        type=int,
        default=0,
        help="which passages the speed and sweep queries come from (not 0: steps-query-seed-N.json)",
    )
    ap.add_argument("--clients", type=int, default=20)
    args = ap.parse_args()
    tmp, work = open_workdir(args.workdir, "ragrl-retrieval-scale-")
    record_path = work / "steps.json"
    record = json.loads(record_path.read_text()) if record_path.is_file() else {}
    corpus, ivf, bm25 = work / "corpus.jsonl", work / "ivf-pq", work / "bm25"
    n = args.passages
    encoder = [] if args.model == "minilm" else ["--model", args.model]
    encoder += ["--max-length", str(args.max_length)] if args.max_length else []
    step(
        "synth-corpus",
        corpus,
        [*RAGRL, "data", "synth-corpus", "-n", str(n), "--words", str(args.words), "--out", str(corpus)],
        work,
        record,
    )
    step(
        "index ivf-pq", ivf / "retriever.json",
        [*RAGRL, "index", str(corpus), "--retriever", "dense", *encoder, "--index-type", "ivf-pq",
         "--recall-check", "200", "--out", str(ivf)],
        work, record,
    )  # fmt: skip
    hybrid = work / "hybrid"
    if args.bm25:
        step(
            "index bm25",
            bm25 / "retriever.json",
            [*RAGRL, "index", str(corpus), "--out", str(bm25)],
            work,
            record,
        )
        step(
            "index hybrid", hybrid / "retriever.json",
            [*RAGRL, "index", "--retriever", "hybrid", "--components", f"{bm25},{ivf}", "--out", str(hybrid)],
            work, record,
        )  # fmt: skip
    print("speed ...", flush=True)
    record["speed"] = speed(ivf, args.queries, 32, args.query_seed)
    print(record["speed"], flush=True)
    from ragrl.retrieval.store import PassageStore

    queries = probe_queries(PassageStore.open(ivf), 400, words=12, seed=1)
    served = [("serve ivf-pq", ivf), *([("serve bm25 + ivf-pq (hybrid)", hybrid)] if args.bm25 else [])]
    for name, index_dir in served:
        print(f"{name} ...", flush=True)
        record[name] = serve(index_dir, queries, args.clients, 20, 8)
        print(record[name], flush=True)
    if args.sweep:
        print("sweep ...", flush=True)
        record["sweep"] = sweep(ivf, args.queries, 32, args.query_seed)
    record["bytes a passage"] = sizes(ivf, n)
    record["recall check"] = json.loads((ivf / "recall.json").read_text())
    if args.query_seed:  # steps.json keeps the figures of the queries the defaults were chosen on
        record_path = work / f"steps-query-seed-{args.query_seed}.json"
    record_path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")

    lines = [f"| step ({n:,} passages) | wall s | peak RSS MB |", "|---|---|---|"]
    lines += [
        f"| {k} | {v['seconds']} | {v['peak_rss_mb']:,} |" for k, v in record.items() if "peak_rss_mb" in v
    ]
    sp = record["speed"]
    lines += ["", "| figure | value |", "|---|---|"]
    lines += [
        f"| IVF-PQ queries/s at batch {sp['batch']} (with re-ranking) | {sp['ivf_pq_qps']:,} |",
        f"| flat queries/s at batch {sp['batch']}, same vectors ({sp['flat_index_mb']:,} MB) | "
        f"{sp['flat_qps']:,} |",
        f"| recall@10 of IVF-PQ against flat, {sp['queries']} queries | {sp['recall@10']} |",
        f"| recall check of `ragrl index` (200 queries) | {record['recall check']} |",
    ]  # fmt: skip
    for name, _ in served:
        sv = record[name]
        lines += [
            f"| {name}: RSS loaded / after {sv['requests']} requests (peak) | {sv['loaded']['rss_mb']:,} / "
            f"{sv['after']['rss_mb']:,} ({sv['after']['peak_rss_mb']:,}) MB |",
            f"| {name}: {sv['clients']} clients, errors / p50 / p99 / queries/s | {sv['errors']} / "
            f"{sv['p50_s']} s / {sv['p99_s']} s / {sv['queries_per_s']} |",
        ]  # fmt: skip
    lines += ["", "| file | bytes a passage |", "|---|---|"]
    lines += [f"| {k} | {v:,} |" for k, v in record["bytes a passage"].items()]
    lines += ["", "| 21M passages, e5-base (768-d) | projected GB |", "|---|---|"]
    lines += [f"| {name} | {b / 1e9:,.1f} |" for name, b in projection()]
    if args.sweep:
        lines += [
            "",
            "| index, settings | recall@10 | queries/s | ÷ flat (flat's queries/s) |",
            "|---|---|---|---|",
        ]
        for r in record["sweep"]:
            settings = ", ".join(f"{k} {r[k]}" for k in ("nprobe", "rerank", "ef_search") if k in r)
            ratio = f"{r['ratio']}× ({r['flat_qps']})"
            lines += [f"| {r['index']} {settings} | {r['recall@10']} | {r['qps']:,} | {ratio} |"]
    print("\n".join(lines))
    print(f"IVF-PQ ÷ flat queries/s at batch 32: {sp['ratio']}")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
