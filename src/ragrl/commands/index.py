"""`ragrl index`: build a retrieval index from corpus files (BM25, dense, or a hybrid of the two).

Heavy imports (bm25s, torch, faiss) happen inside the command so `ragrl --help` stays fast.
"""

from __future__ import annotations

import json
import shutil
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
