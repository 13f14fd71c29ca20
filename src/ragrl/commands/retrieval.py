"""`ragrl index` and `ragrl search`.

Heavy imports (bm25s, torch, faiss) happen inside the commands so `ragrl --help` stays fast.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from ragrl.console import console
from ragrl.errors import RagrlError


class RetrieverKind(StrEnum):
    bm25 = "bm25"
    dense = "dense"
    hybrid = "hybrid"


class IndexType(StrEnum):
    flat = "flat"
    hnsw = "hnsw"
    ivf_pq = "ivf-pq"


BUILD_FOLDER = ".build"
"""Inside ``--out``: a dense build's encoded shards, kept when the build is killed, so the same command
run again goes on from them; removed when the index is saved."""


class CacheMode(StrEnum):
    readwrite = "readwrite"
    record = "record"
    replay = "replay"
    off = "off"


def _human_size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GB"


def _read_corpora(paths: list[Path], folder: Path):
    """The corpus files merged by id, streamed into a passage store in ``folder`` (so a corpus of
    millions of passages is never held in memory) and opened from there."""
    from ragrl.data.io import iter_corpora
    from ragrl.retrieval.store import PassageStore

    reports: list[Any] = []
    with console.status("reading the corpus"):
        PassageStore.write(folder, iter_corpora(paths, reports))
    for report in reports:
        console.print(f"read {report.read:,} passages from {report.path}", highlight=False)
    return PassageStore.open(folder)


USED_BY = {
    **dict.fromkeys(
        ("model", "query_prefix", "passage_prefix", "batch_size", "device", "index_spec", "train_size",
         "max_length", "nprobe", "ef_search", "rerank", "shard_size"),
        ("dense", "hybrid"),
    ),
    **dict.fromkeys(("bm25_method", "k1", "b", "stem"), ("bm25", "hybrid")),
    **dict.fromkeys(("rrf_k", "depth"), ("hybrid",)),
}  # fmt: skip
"""Which ``--retriever`` reads each option of ``ragrl index``; one given for another is refused, never
silently ignored."""


COMPONENTS_READ = ("device", "batch_size", "rrf_k", "depth")
"""What ``--retriever hybrid --components A,B`` reads: the two built indexes load as they are."""


def _refuse_unused(ctx: typer.Context, retriever: str, components: bool) -> None:
    """A ``USED_BY`` option given on the command line that the build does not read (the source is
    compared by name: typer carries its own copy of click's ``ParameterSource``)."""

    def given(name: str) -> bool:
        return getattr(ctx.get_parameter_source(name), "name", None) == "COMMANDLINE"

    flags = {p.name: "/".join((*p.opts, *getattr(p, "secondary_opts", ()))) for p in ctx.command.params}
    if components:
        unused = [name for name in (*USED_BY, "index_type") if name not in COMPONENTS_READ and given(name)]
        named = ", ".join(flags[name] for name in unused)
        what = "a hybrid index of two built --components (they load as they were built)"
    else:
        unused = [name for name, kinds in USED_BY.items() if retriever not in kinds and given(name)]
        named = ", ".join(f"{flags[name]} (for {' or '.join(USED_BY[name])})" for name in unused)
        what = f"a {retriever} index"
    if unused:
        raise RagrlError(f"not read by {what}: {named}")


def index(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option("--out", "-o", help="Index directory to write.")],
    corpus: Annotated[
        list[Path] | None,
        typer.Argument(
            help="Corpus file(s): jsonl {id, contents} or "
            "{id, title, text}, or a JSON array of {title, text}. "
            "Several files are merged by passage id. "
            "Not needed with --components."
        ),
    ] = None,
    retriever: Annotated[RetrieverKind, typer.Option(help="Retriever type.")] = RetrieverKind.bm25,
    model: Annotated[
        str | None,
        typer.Option(
            help="Dense: local sentence-transformers model directory (default: the bundled all-MiniLM-L6-v2)."
        ),
    ] = None,
    query_prefix: Annotated[
        str, typer.Option(help="Dense: text put before every query (e5: 'query: ').")
    ] = "",
    passage_prefix: Annotated[
        str, typer.Option(help="Dense: text put before every passage (e5: 'passage: ').")
    ] = "",
    batch_size: Annotated[int, typer.Option(min=1, help="Dense: encoding batch size.")] = 64,
    device: Annotated[
        str, typer.Option(help="Dense: 'auto' (cuda if available), 'cpu', 'cuda', 'cuda:1', ...")
    ] = "auto",
    bm25_method: Annotated[
        str, typer.Option(help="BM25: lucene, robertson, atire, bm25l, bm25+.")
    ] = "lucene",
    k1: Annotated[float, typer.Option(min=0.0, help="BM25: k1 (term-frequency saturation, >= 0).")] = 1.5,
    b: Annotated[float, typer.Option(min=0.0, max=1.0, help="BM25: b (length normalization, 0-1).")] = 0.75,
    stem: Annotated[bool, typer.Option(help="BM25: English Snowball stemming.")] = True,
    components: Annotated[
        str | None,
        typer.Option(
            help="Hybrid: two existing index directories "
            "'DIR_A,DIR_B' to fuse (default: build bm25 + dense "
            "from CORPUS)."
        ),
    ] = None,
    rrf_k: Annotated[float, typer.Option(help="Hybrid: RRF constant.")] = 60.0,
    depth: Annotated[int, typer.Option(help="Hybrid: depth each component is searched to.")] = 100,
    index_type: Annotated[
        IndexType,
        typer.Option(help="Dense: faiss index type: flat (exact), hnsw, ivf-pq (docs/retrieval.md)."),
    ] = IndexType.flat,
    index_spec: Annotated[
        str | None,
        typer.Option(
            help="Dense: a faiss factory string instead of the type's default, e.g. 'IVF4096,PQ192x4fsr'."
        ),
    ] = None,
    train_size: Annotated[
        int | None,
        typer.Option(
            help="Dense: vectors an IVF / PQ index is trained on, drawn at random (default: 64 a list, at "
            "least 100,000).",
            min=1,
        ),
    ] = None,
    max_length: Annotated[
        int | None,
        typer.Option(
            help="Dense: cut passages and queries to this many tokens (default: the model's own, 256 for "
            "MiniLM); recorded in the index.",
            min=1,
        ),
    ] = None,
    nprobe: Annotated[
        int | None,
        typer.Option(
            help="Dense IVF: lists a search visits (default 512, at most the index's lists).", min=1
        ),
    ] = None,
    ef_search: Annotated[int | None, typer.Option(help="Dense HNSW: efSearch (default 128).", min=1)] = None,
    rerank: Annotated[
        int | None,
        typer.Option(
            help="Dense PQ: re-score rerank × k candidates exactly (default 10; 0 or 1: off).", min=0
        ),
    ] = None,
    shard_size: Annotated[
        int, typer.Option(help="Dense: passages a shard encodes (a killed build keeps its shards).", min=1)
    ] = 50_000,
    recall_check: Annotated[
        int,
        typer.Option(
            help="Dense: after the build, recall@1/10 of the index against exact search, over this many "
            "queries (the first sentence of passages drawn at random); written to recall.json.",
            min=0,
        ),
    ] = 0,
) -> None:
    """Build a retrieval index from corpus files and save it to a directory."""
    from ragrl.retrieval.base import MANIFEST_NAME, directory_size, load_retriever

    resumable = (out / BUILD_FOLDER).is_dir()  # a killed dense build: its shards are kept
    _refuse_unused(ctx, retriever.value, components is not None)
    if recall_check and retriever is not RetrieverKind.dense:
        raise RagrlError("--recall-check measures a dense index against exact search: use --retriever dense")
    if index_type is not IndexType.flat and retriever is RetrieverKind.bm25:
        raise RagrlError(
            f"--index-type {index_type.value} is for dense indexes (--retriever dense or hybrid)"
        )
    if (
        out.exists()
        and (not out.is_dir() or any(out.iterdir()))
        and not (out / MANIFEST_NAME).exists()
        and not resumable
    ):
        raise RagrlError(
            f"{out}: exists and is not an empty directory or a ragrl index; choose another --out"
        )
    t0 = time.perf_counter()
    comp_dirs: list[Path] = []
    if components is not None:
        if retriever is not RetrieverKind.hybrid:
            raise RagrlError("--components is only for --retriever hybrid")
        if corpus:
            raise RagrlError("--components fuses two built indexes: it reads no CORPUS file (leave them out)")
        comp_dirs = [Path(c.strip()) for c in components.split(",") if c.strip()]
        if len(comp_dirs) != 2:
            raise RagrlError(
                f"--components needs exactly two index directories 'DIR_A,DIR_B', got {components!r}"
            )
    if not comp_dirs and not corpus:
        raise RagrlError("give at least one CORPUS file (or --retriever hybrid --components DIR_A,DIR_B)")
    if retriever is not RetrieverKind.bm25:  # the encoder's device, before the corpus is read
        from ragrl.retrieval.dense import resolve_device

        resolve_device(device)

    def build_bm25():
        from ragrl.retrieval.bm25 import BM25Retriever

        with console.status(f"indexing {len(passages):,} passages with BM25"):
            return BM25Retriever.build(
                passages, method=bm25_method, k1=k1, b=b, stemmer=stem, workdir=out / BUILD_FOLDER
            )

    def build_dense():
        from ragrl.retrieval.dense import DenseRetriever

        return DenseRetriever.build(
            passages,
            model=model,
            query_prefix=query_prefix,
            passage_prefix=passage_prefix,
            batch_size=batch_size,
            device=device,
            index_type=index_type.value,
            index_spec=index_spec,
            train_size=train_size,
            nprobe=nprobe,
            ef_search=ef_search,
            rerank=rerank,
            workdir=out / BUILD_FOLDER,
            shard_size=shard_size,
            max_length=max_length,
        )

    existed, saving = out.exists(), False
    try:
        passages = _read_corpora(corpus, out / BUILD_FOLDER / "corpus") if not comp_dirs else None
        (out / "recall.json").unlink(missing_ok=True)  # a rebuild in place: the old index's figures go

        if retriever is RetrieverKind.bm25:
            built: Any = build_bm25()
        elif retriever is RetrieverKind.dense:
            built = build_dense()
        else:
            from ragrl.retrieval.hybrid import HybridRetriever

            if comp_dirs:
                a, bb = (load_retriever(d, device=device, batch_size=batch_size) for d in comp_dirs)
            else:
                a, bb = build_bm25(), build_dense()
            built = HybridRetriever(a, bb, rrf_k=rrf_k, depth=depth)
            if passages is None:
                passages = getattr(a, "passages", [])
        (out / BUILD_FOLDER).mkdir(parents=True, exist_ok=True)  # marks a save cut short: a rerun is let in
        saving = True
        built.save(out)
    except Exception:  # bad input or a failed build: nothing half-made is left, but encoded shards
        _after_failed_build(out, existed, saving)
        raise
    shutil.rmtree(out / BUILD_FOLDER, ignore_errors=True)
    elapsed = time.perf_counter() - t0
    n = len(passages) if passages is not None else 0
    typer.echo(
        f"indexed {n:,} passages with {retriever.value} in {elapsed:.1f} s -> {out} "
        f"({_human_size(directory_size(out))}, fingerprint {built.fingerprint[:12]})",
        err=True,
    )
    if recall_check:
        _recall_check(built, out, recall_check)


def _after_failed_build(out: Path, existed: bool, saving: bool) -> None:
    """Clean up after a build that raised. A save that failed part-way (a full disk) has replaced part
    of ``out``: ``out/.build`` stays, so the same command is let in to rebuild it. A dense build's
    finished shards stay (a rerun with the same encoder settings resumes from them, as after a kill)
    and are named. Otherwise ``out/.build`` goes, and so does ``out`` when this build made it and left
    it empty."""
    work = out / BUILD_FOLDER
    if saving:  # work was made before the save began
        console.print(f"{out}: the save failed; run the command again to rebuild the index")
        return
    shards = sorted((work / "shards").glob("*")) if (work / "shards").is_dir() else []
    if shards:
        console.print(
            f"{work}: {len(shards)} encoded shard file(s) kept; a rerun with the same encoder settings "
            "resumes from them (delete the folder to start afresh)"
        )
        return
    shutil.rmtree(work, ignore_errors=True)
    if not existed and out.is_dir() and not any(out.iterdir()):
        out.rmdir()


def _recall_check(built: Any, out: Path, n: int) -> None:
    """Recall@1/10 of a dense index against exact search, written to ``recall.json`` and printed."""
    from ragrl.retrieval.ann import probe_queries

    if not hasattr(built, "recall"):
        raise RagrlError("--recall-check is for dense indexes (--retriever dense)")
    queries = probe_queries(built.passages, n)
    t0 = time.perf_counter()
    recall = {"queries": len(queries), "index": built.params.get("index", "Flat"), **built.recall(queries)}
    (out / "recall.json").write_text(json.dumps(recall, indent=2) + "\n", encoding="utf-8")
    typer.echo(
        f"recall against exact search over {len(queries)} queries: "
        + ", ".join(f"{k} {v:.3f}" for k, v in recall.items() if k.startswith("recall@"))
        + f" ({time.perf_counter() - t0:.1f} s) -> {out / 'recall.json'}",
        err=True,
    )


def _read_queries(path: Path) -> tuple[list[str], list[Any] | None]:
    """Queries from a plain-text file (one per line) or a canonical question jsonl."""
    from ragrl.data.io import read_examples, read_text

    text = read_text(path)  # a missing, compressed or non-UTF-8 file is a one-line error
    first = next((line for line in text.split("\n") if line.strip()), "")  # not splitlines: U+2028
    record = None
    if first.lstrip().startswith("{"):
        try:
            record = json.loads(first)
        except json.JSONDecodeError:
            record = None
    if isinstance(record, dict) and "question" in record:
        examples, _ = read_examples(path)
        return [ex.question for ex in examples], examples
    lines = [line.strip() for line in text.splitlines()]
    if not any(lines):
        raise RagrlError(f"{path}: no queries (the file is empty or blank)")
    return [q for q in lines if q], None


def _print_table(query: str, hits: list[Any], snippet: int) -> None:
    from rich.table import Table

    table = Table(title=f"{query}", title_justify="left", show_lines=False)
    table.add_column("rank", justify="right")
    table.add_column("id", no_wrap=True)
    table.add_column("title")
    table.add_column("score", justify="right")
    table.add_column("text")
    for rank, h in enumerate(hits, start=1):
        text = h.passage.text if len(h.passage.text) <= snippet else h.passage.text[:snippet].rstrip() + "…"
        table.add_row(str(rank), h.passage.id, h.passage.title, f"{h.score:.4f}", text)
    import os

    from rich.console import Console

    width = None if sys.stdout.isatty() else int(os.environ.get("COLUMNS", "120"))
    Console(width=width).print(table)
    if not hits:
        console.print("no passage shares a term with the query (no hits)")


def _parse_ks(text: str) -> tuple[int, ...]:
    try:
        ks = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise RagrlError(f"--eval-k must be comma-separated positive integers, got {text!r}") from None
    if not ks or ks[0] < 1:
        raise RagrlError(f"--eval-k must be comma-separated positive integers, got {text!r}")
    return ks


def search(
    index_dir: Annotated[Path, typer.Argument(metavar="DIR", help="Index directory (from `ragrl index`).")],
    query: Annotated[str | None, typer.Argument(help="A query; omit it when using --queries.")] = None,
    k: Annotated[int, typer.Option("-k", "--k", help="Hits per query.", min=1)] = 5,
    queries: Annotated[
        Path | None,
        typer.Option(help="File of queries: plain text (one per line) or a canonical question jsonl."),
    ] = None,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Write hits as jsonl here (default: stdout).")
    ] = None,
    cache: Annotated[Path | None, typer.Option(help="sqlite retrieval cache file.")] = None,
    cache_mode: Annotated[CacheMode, typer.Option(help="How to use --cache.")] = CacheMode.readwrite,
    eval_: Annotated[
        bool,
        typer.Option(
            "--eval",
            help="Print retrieval metrics (needs a question file with supporting_ids and/or golden_answers).",
        ),
    ] = False,
    eval_k: Annotated[str, typer.Option(help="Cut-offs for --eval, comma-separated.")] = "2,5,10",
    device: Annotated[str, typer.Option(help="Dense: device to encode queries on.")] = "auto",
    batch_size: Annotated[int, typer.Option(min=1, help="Queries searched per batch with --queries.")] = 1024,
    snippet: Annotated[int, typer.Option(help="Characters of text shown per hit.")] = 100,
) -> None:
    """Search an index: one query as a table (as jsonl with --out), or a file of queries as jsonl (plus
    metrics with --eval)."""
    from ragrl.console import progress
    from ragrl.retrieval.base import MANIFEST_NAME, load_retriever, read_manifest
    from ragrl.retrieval.cache import CachedRetriever

    if (query is None) == (queries is None):
        raise RagrlError("give either a QUERY or --queries FILE (not both)")
    if eval_ and queries is None:
        raise RagrlError("--eval needs --queries with a canonical question file")
    if query is not None and not query.strip():
        raise RagrlError("QUERY is empty: give the words to search for")
    ks = _parse_ks(eval_k) if eval_ else ()

    if cache is not None and cache_mode is CacheMode.replay:
        fingerprint = None
        if (index_dir / MANIFEST_NAME).is_file():
            fingerprint = read_manifest(index_dir).get("fingerprint")
        retriever: Any = CachedRetriever(None, cache, "replay", fingerprint=fingerprint)
    else:
        retriever = load_retriever(index_dir, device=device)
        if cache is not None:
            retriever = CachedRetriever(retriever, cache, cache_mode.value)

    if query is not None and out is None:
        hits = retriever.search([query], k)[0]
        _print_table(query, hits, snippet)
        return

    texts, examples = ([query], None) if query is not None else _read_queries(queries)  # type: ignore[arg-type]
    if eval_ and examples is None:
        raise RagrlError(
            f"{queries}: --eval needs a canonical question jsonl (with supporting_ids and/or "
            "golden_answers), not plain text"
        )
    eval_depth = max(k, *ks) if ks else k
    all_hits: list[list[Any]] = []
    batches = [texts[i : i + batch_size] for i in range(0, len(texts), batch_size)]
    for batch in progress(batches, f"searching {len(texts):,} queries", total=len(batches)):
        all_hits.extend(retriever.search(batch, eval_depth))

    def records():
        for i, (q, hits) in enumerate(zip(texts, all_hits, strict=True)):
            rec: dict[str, Any] = {"id": examples[i].id} if examples is not None else {}
            rec["query"] = q
            rec["hits"] = [{"id": h.passage.id, "title": h.passage.title, "score": h.score} for h in hits[:k]]
            yield rec

    if out is not None:
        from ragrl.data.io import write_jsonl

        n = write_jsonl(out, records())
        console.print(f"wrote hits for {n:,} queries to {out}", highlight=False)
    elif not eval_:
        for rec in records():
            sys.stdout.write(json.dumps(rec, ensure_ascii=False) + "\n")
    if isinstance(retriever, CachedRetriever):
        console.print(
            f"cache: {retriever.queries_from_cache:,} hits, {retriever.queries_searched:,} misses "
            f"({retriever.mode})",
            highlight=False,
        )
    if eval_:
        from ragrl.retrieval.evaluate import evaluate_hits

        assert examples is not None
        metrics = evaluate_hits(examples, all_hits, ks)
        metrics = {"k": list(ks), **metrics}
        typer.echo(json.dumps(metrics, indent=2))


def serve(
    index_dir: Annotated[
        Path, typer.Argument(metavar="INDEX_DIR", help="Index directory (from `ragrl index`).")
    ],
    host: Annotated[
        str, typer.Option(help="Address to listen on (0.0.0.0 for every interface).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.", min=1, max=65535)] = 8000,
    max_k: Annotated[int, typer.Option(help="Largest topk a request may ask for.", min=1)] = 100,
    max_batch: Annotated[int, typer.Option(help="Most queries in one request.", min=1)] = 512,
    max_query_chars: Annotated[
        int, typer.Option(help="Longest query (characters); longer: 422.", min=1)
    ] = 4096,
    max_request_bytes: Annotated[
        int, typer.Option(help="Largest request body (bytes); larger: 413.", min=1)
    ] = 1 << 20,
    batch_queries: Annotated[
        int,
        typer.Option(
            help="Queries per search round: concurrent requests share each round fairly, so a big one "
            "cannot starve the others.",
            min=1,
        ),
    ] = 64,
    device: Annotated[str, typer.Option(help="Dense: device to encode queries on.")] = "auto",
    nprobe: Annotated[
        int | None, typer.Option(help="Dense IVF: lists a search visits (default: the index's).", min=1)
    ] = None,
    ef_search: Annotated[
        int | None, typer.Option(help="Dense HNSW: efSearch (default: the index's).", min=1)
    ] = None,
    rerank: Annotated[
        int | None, typer.Option(help="Dense PQ: exact re-scoring depth × k (default: the index's).", min=0)
    ] = None,
) -> None:
    """Serve an index over HTTP with Search-R1's /retrieve contract (and /health)."""
    from ragrl.retrieval.base import load_retriever
    from ragrl.retrieval.server import SERVER_EXTRA, create_app

    try:
        import uvicorn
    except ImportError:
        raise RagrlError(f"`ragrl serve` needs uvicorn: {SERVER_EXTRA}") from None
    retriever = load_retriever(index_dir, device=device, nprobe=nprobe, ef_search=ef_search, rerank=rerank)
    app = create_app(
        retriever,
        max_batch=max_batch,
        max_k=max_k,
        max_query_chars=max_query_chars,
        max_request_bytes=max_request_bytes,
        batch_queries=batch_queries,
    )
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}"
    example = json.dumps({"queries": ["your question"], "topk": 3, "return_scores": True})
    what = f"{type(retriever).__name__}, fingerprint {retriever.fingerprint[:12]}"
    typer.echo(
        f"serving {index_dir} ({what}) at {url}\n"
        f"  curl -s {url}/retrieve -H 'Content-Type: application/json' -d '{example}'\n"
        f"  curl -s {url}/health",
        err=True,
    )
    uvicorn.run(app, host=host, port=port, log_level="info")
