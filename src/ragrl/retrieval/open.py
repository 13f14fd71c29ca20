"""``open_retriever``: the retriever a user names, wherever it lives.

``where`` is either an index folder written by ``ragrl index`` (loaded in this process with
``load_retriever``) or the URL of a server speaking Search-R1's ``/retrieve`` contract: ``ragrl serve``,
Search-R1's own ``retrieval_server.py``, or verl's copy of it (``HttpRetriever``). One server can then
serve every evaluation and every training process, and an index already served for Search-R1 is used
as it is::

    retriever = open_retriever("runs/wiki/bm25")
    retriever = open_retriever("http://127.0.0.1:8000", cache="runs/retrieval.sqlite")

A URL is checked when it is opened, which ``ragrl eval``, ``ragrl ask`` and training do before a model
loads: ``GET /health`` where the server has it (``ragrl serve``), else one search (Search-R1's server has
no ``/health``). A server that is down is an error naming it after the client's retries (3.5 s of
back-off for a refused connection; a host that drops packets waits out the 30 s timeout of each try).

``cache`` puts the on-disk retrieval cache (``CachedRetriever``) in front, keyed by the index's
fingerprint: ``readwrite`` searches only what it has not stored, ``record`` searches and stores
everything, ``replay`` reads the stored hits and searches nothing (no index is loaded and no server is
asked; a query that was not stored is an error), ``off`` leaves the cache out. A server that does not
report a fingerprint on ``/health`` (Search-R1's has no ``/health``) cannot key a cache: that is an
error saying so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ragrl.errors import RagrlError
from ragrl.retrieval.base import MANIFEST_NAME, Retriever, load_retriever, read_manifest
from ragrl.retrieval.cache import MODES, CachedRetriever
from ragrl.retrieval.http import HttpRetriever, ServerUnreachable


def is_url(where: str | Path | None) -> bool:
    """Whether ``where`` names a retrieval server rather than an index folder."""
    return isinstance(where, str) and where.strip().lower().startswith(("http://", "https://"))


def _check_server(remote: HttpRetriever) -> None:
    """The server answers: ``/health`` where it has one, else a one-word search (Search-R1's server)."""
    try:
        remote.health()
        return
    except ServerUnreachable as e:  # nothing there: no second request
        raise RagrlError(f"{remote.url} does not answer as a retrieval server ({e})") from None
    except RagrlError:
        pass
    try:
        remote.search(["test"], 1)
    except RagrlError as e:
        raise RagrlError(f"{remote.url} does not answer as a retrieval server ({e})") from None


def open_retriever(
    where: str | Path,
    *,
    cache: str | Path | None = None,
    cache_mode: str = "readwrite",
    **options: Any,
) -> Retriever:
    """The retriever at ``where`` (an index folder or a server's URL), behind ``cache`` when given.

    ``options`` go to ``load_retriever`` for a folder (``device=``, ``nprobe=``, ...)."""
    if cache_mode not in MODES:
        raise RagrlError(f"unknown cache mode {cache_mode!r} (expected one of {', '.join(MODES)})")
    if cache is None and cache_mode != "readwrite":
        raise RagrlError(
            f"cache mode {cache_mode!r} says how to use a retrieval cache: give the cache file too"
        )
    url = is_url(where)
    if cache is not None and cache_mode == "replay":
        fingerprint = None
        if not url and (Path(where) / MANIFEST_NAME).is_file():
            fingerprint = read_manifest(where).get("fingerprint")
        return CachedRetriever(None, cache, "replay", fingerprint=fingerprint)
    if url:
        remote = HttpRetriever(str(where))
        _check_server(remote)
        inner: Retriever = remote
    else:
        inner = load_retriever(where, **options)
    if cache is None or cache_mode == "off":
        return inner
    try:
        inner.fingerprint  # noqa: B018  (the cache's key: asked for now, not at the first search)
    except RagrlError as e:
        raise RagrlError(
            f"{e}: a retrieval cache keys its hits by the index's fingerprint; serve the index with "
            "`ragrl serve`, whose /health reports it, or leave the cache out"
        ) from None
    return CachedRetriever(inner, cache, cache_mode)


def close_all(*things: Any) -> None:
    """Close each of ``things`` that can be closed (a retriever's HTTP client, its cache's database, a
    generation backend's engine)."""
    failed: BaseException | None = None
    for thing in things:
        close = getattr(thing, "close", None)
        try:
            if close is not None:
                close()
        except Exception as e:  # the others are still closed; the first failure is raised after them
            failed = failed or e
    if failed is not None:
        raise failed
