"""Serve any retriever over HTTP with Search-R1's ``/retrieve`` contract (``ragrl serve``).

``POST /retrieve`` takes ``{"queries": [...], "topk": 3, "return_scores": true}`` (``query_list`` is
accepted for ``queries``, as verl's SearchTool names it) and answers
``{"result": [[{"document": {"id", "contents", "title", "text"}, "score": s}, ...], ...]}``, one list
per query; with ``"return_scores": false`` each item is the document alone, as in Search-R1.
``GET /health`` answers ``{"status": "ok", "retriever", "fingerprint", "passages"}``.

Bad requests (no queries, an empty list, a query that is not a string or is longer than
``max_query_chars``, ``topk`` outside ``1..max_k``, more than ``max_batch`` queries, invalid JSON) are
answered with status 422 and a message naming the field, never a 500; a body over ``max_request_bytes``
is refused with 413 before it is read to the end. Searches run on one worker thread off the event loop
(``ragrl.retrieval.batcher``): concurrent requests are batched in fair rounds, so one big request cannot
starve the others.

fastapi is an optional dependency (``pip install 'ragrl[server]'``), imported when the app is created.
"""

# No ``from __future__ import annotations``: the request model is built inside ``create_app`` and
# FastAPI/pydantic must see its annotations as real objects, not strings to resolve later.

import asyncio
import contextlib
import json
from typing import Any

from ragrl.errors import RagrlError
from ragrl.retrieval.base import Hit, Retriever
from ragrl.retrieval.batcher import SearchBatcher

SERVER_EXTRA = "pip install 'ragrl[server]'"


def document(hit: Hit) -> dict[str, str]:
    """The document of one hit as served: FlashRAG's ``id``/``contents`` plus ``title`` and ``text``."""
    p = hit.passage
    return {"id": p.id, "contents": p.contents, "title": p.title, "text": p.text}


def retriever_kind(retriever: Any) -> str:
    """``bm25``/``dense``/``hybrid`` for ragrl's retrievers (wrappers report their inner one)."""
    kind = getattr(retriever, "kind", None)
    if isinstance(kind, str):
        return kind
    inner = getattr(retriever, "inner", None)
    if inner is not None and inner is not retriever:
        return retriever_kind(inner)
    return type(retriever).__name__


def passage_count(retriever: Any) -> int | None:
    """How many passages the retriever searches, when it can tell."""
    try:
        return len(retriever)
    except TypeError:
        pass
    passages = getattr(retriever, "passages", None)
    if passages is not None:
        return len(passages)
    for attr in ("inner", "a"):  # CachedRetriever, HybridRetriever (both components share a corpus)
        inner = getattr(retriever, attr, None)
        if inner is not None and inner is not retriever:
            return passage_count(inner)
    return None


def _field_message(error: dict[str, Any]) -> str:
    """One validation error as ``field: message`` (``queries.2: Input should be a valid string``)."""
    kind, msg = error.get("type"), error.get("msg", "invalid")
    loc = list(error.get("loc", ()))
    if kind == "json_invalid":
        reason = (error.get("ctx") or {}).get("error")
        at = f" at character {loc[-1]}" if loc and isinstance(loc[-1], int) else ""
        return f"body: invalid JSON{at}" + (f" ({reason})" if reason else "")
    parts = [str(part) for part in loc if part != "body"]
    where = ".".join(parts) if parts else "body"
    if kind == "missing" and parts == ["queries"]:
        return "queries: field required (a list of query strings; 'query_list' is accepted too)"
    return f"{where}: {msg}"


class BodyLimit:
    """ASGI middleware: a request body over ``limit`` bytes is answered 413, as soon as its declared
    length, or for a chunked body the bytes received so far, pass the limit. A body within the limit is
    read here and handed on whole (the limit bounds what is held)."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._refuse(send, int(declared))
            return
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.limit:
                await self._refuse(send, size)
                return
            more = message.get("more_body", False)
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send: Any, size: int) -> None:
        body = json.dumps(
            {"error": f"request body of {size:,}+ bytes is over the server's limit of {self.limit:,} bytes"}
        ).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def create_app(
    retriever: Retriever,
    *,
    max_batch: int = 512,
    max_k: int = 100,
    max_query_chars: int = 4096,
    max_request_bytes: int = 1 << 20,
    batch_queries: int = 64,
) -> Any:
    """A FastAPI app serving ``retriever`` with Search-R1's ``/retrieve`` contract and ``/health``."""
    try:
        from fastapi import FastAPI, Request
        from fastapi.exceptions import RequestValidationError
        from fastapi.responses import JSONResponse
        from pydantic import AliasChoices, BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr
    except ImportError:
        raise RagrlError(f"serving a retriever over HTTP needs fastapi: {SERVER_EXTRA}") from None
    from typing import Annotated

    limits = {"max_batch": max_batch, "max_k": max_k, "max_query_chars": max_query_chars}
    limits.update(max_request_bytes=max_request_bytes, batch_queries=batch_queries)
    bad = {name: value for name, value in limits.items() if value < 1}
    if bad:
        named = ", ".join(f"{k}={v}" for k, v in bad.items())
        raise RagrlError(f"server limits must be positive, got {named}")

    class RetrieveRequest(BaseModel):
        model_config = ConfigDict(extra="ignore")

        queries: Annotated[
            list[Annotated[StrictStr, Field(max_length=max_query_chars)]],
            Field(
                min_length=1,
                max_length=max_batch,
                validation_alias=AliasChoices("queries", "query_list"),
                description="The queries to search (alias: query_list).",
            ),
        ]
        topk: Annotated[StrictInt, Field(ge=1, le=max_k, description="Hits per query.")] = 3
        return_scores: StrictBool = True

    batcher = SearchBatcher(retriever, batch_queries=batch_queries)

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> Any:
        yield
        await asyncio.to_thread(batcher.close)  # joins the worker: off the event loop

    app = FastAPI(
        title="ragrl retriever",
        description="Search-R1-compatible retrieval server (POST /retrieve, GET /health).",
        lifespan=lifespan,
    )
    app.add_middleware(BodyLimit, limit=max_request_bytes)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        message = "; ".join(_field_message(e) for e in errors) or "invalid request"
        detail = [{"loc": list(e.get("loc", ())), "msg": e.get("msg"), "type": e.get("type")} for e in errors]
        return JSONResponse({"error": message, "detail": detail}, status_code=422)

    @app.exception_handler(RagrlError)
    async def _ragrl_error(request: Request, exc: RagrlError) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=400)

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {
            "status": "ok",
            "retriever": retriever_kind(retriever),
            "fingerprint": retriever.fingerprint,
            "passages": passage_count(retriever),
        }

    @app.post("/retrieve", response_class=JSONResponse)
    async def retrieve(body: RetrieveRequest) -> JSONResponse:
        hits = await asyncio.wrap_future(batcher.submit(list(body.queries), body.topk))
        if body.return_scores:
            result = [[{"document": document(h), "score": float(h.score)} for h in row] for row in hits]
        else:
            result = [[document(h) for h in row] for row in hits]
        return JSONResponse({"result": result})

    return app
