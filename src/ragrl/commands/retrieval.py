"""`ragrl search` and `ragrl serve` (`ragrl index` is in ``commands/index.py``).

Heavy imports (bm25s, torch, faiss) happen inside the commands so `ragrl --help` stays fast.
"""

from __future__ import annotations

import copy
import json
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from ragrl.console import console
from ragrl.errors import RagrlError


class CacheMode(StrEnum):
    readwrite = "readwrite"
    record = "record"
    replay = "replay"
    off = "off"


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
    index_dir: Annotated[
        str,
        typer.Argument(
            metavar="DIR|URL",
            help="Index directory (from `ragrl index`), or a retrieval server's URL (`ragrl serve`, "
            "Search-R1's retrieval_server.py).",
        ),
    ],
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
    from ragrl.retrieval.cache import CachedRetriever
    from ragrl.retrieval.open import close_all, open_retriever

    if (query is None) == (queries is None):
        raise RagrlError("give either a QUERY or --queries FILE (not both)")
    if eval_ and queries is None:
        raise RagrlError("--eval needs --queries with a canonical question file")
    if query is not None and not query.strip():
        raise RagrlError("QUERY is empty: give the words to search for")
    ks = _parse_ks(eval_k) if eval_ else ()

    texts, examples = ([query], None) if query is not None else _read_queries(queries)  # type: ignore[arg-type]
    if eval_ and examples is None:
        raise RagrlError(
            f"{queries}: --eval needs a canonical question jsonl (with supporting_ids and/or "
            "golden_answers), not plain text"
        )
    retriever: Any = open_retriever(index_dir, cache=cache, cache_mode=cache_mode.value, device=device)
    try:
        if query is not None and out is None:
            _print_table(query, retriever.search([query], k)[0], snippet)
            return
        eval_depth = max(k, *ks) if ks else k
        all_hits: list[list[Any]] = []
        batches = [texts[i : i + batch_size] for i in range(0, len(texts), batch_size)]
        for batch in progress(batches, f"searching {len(texts):,} queries", total=len(batches)):
            all_hits.extend(retriever.search(batch, eval_depth))
    finally:
        close_all(retriever)

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
    access_log: Annotated[
        bool,
        typer.Option("--access-log", help="Print a line for every request (off: a trainer sends thousands)."),
    ] = False,
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
        f"  curl -s {url}/health\n"
        "Ctrl+C stops it.",
        err=True,
    )
    uvicorn.run(
        app, host=host, port=port, log_config=_log_config(access_log), log_level=None, access_log=access_log
    )


def _log_config(access_log: bool) -> dict:
    """uvicorn's logging, quieter: its start-up lines repeat ours, so only its warnings and errors reach
    the terminal, and a line a request (logged at INFO) only with ``--access-log``. (Its ``log_level``
    would set the request lines' logger to the same level and drop them.)"""
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config["loggers"]["uvicorn.error"]["level"] = "WARNING"
    config["loggers"]["uvicorn.access"]["level"] = "INFO" if access_log else "WARNING"
    return config
