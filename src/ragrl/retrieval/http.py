"""``HttpRetriever``: the retriever protocol over Search-R1's ``/retrieve`` HTTP contract.

Works against ``ragrl serve`` and any Search-R1-compatible server (Search-R1's own
``retrieval_server.py``, verl's ``search_r1_like`` copy of it, ...)::

    retriever = HttpRetriever("http://127.0.0.1:8000")
    hits = retriever.search(["who wrote hamlet"], k=3)

Queries are sent in batches of ``batch_size`` with ``return_scores: true``. Connection errors,
timeouts and 5xx answers are retried ``retries`` times, waiting ``backoff * 2**attempt`` seconds
between tries; any other failure is a ``RagrlError`` naming the URL and the status and response text.
Documents become ``Passage``s from ``title``/``text`` when the server sends them (``ragrl serve``
does), otherwise from FlashRAG's ``contents`` (``"title\\ntext"``); a document without an ``id``
(Search-R1's BM25 server sends none) gets a content-derived id (``Passage.make``).

``fingerprint`` is fetched once from ``GET /health`` (``ragrl serve`` reports the served index's), so
``CachedRetriever`` works over HTTP; servers without it need ``fingerprint=`` given explicitly.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ragrl.data.schema import Passage
from ragrl.errors import RagrlError
from ragrl.retrieval.base import Hit, check_k

if TYPE_CHECKING:
    import httpx

_SNIPPET = 300  # characters of a failed response's body quoted in errors


class ServerUnreachable(RagrlError):
    """Every try of a request failed to connect, timed out or got a 5xx answer."""


def _snippet(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _SNIPPET else text[:_SNIPPET] + "…"


class HttpRetriever:
    """A retriever behind an HTTP server speaking Search-R1's ``/retrieve`` contract.

    ``url`` is the server's base URL (a trailing ``/retrieve`` is accepted and dropped). ``client``
    takes a ready ``httpx.Client`` (tests pass one with ``transport=``); its own timeout applies and
    ``close()`` leaves it open. ``fingerprint`` overrides the one ``/health`` reports.
    """

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 30.0,
        retries: int = 3,
        backoff: float = 0.5,
        batch_size: int = 512,
        fingerprint: str | None = None,
        client: httpx.Client | None = None,
    ) -> None:
        try:
            import httpx
        except ImportError:
            raise RagrlError("the HTTP retriever needs httpx: pip install 'ragrl[server]'") from None
        base = str(url).strip().rstrip("/")
        if base.endswith("/retrieve"):
            base = base[: -len("/retrieve")]
        if not base.lower().startswith(("http://", "https://")):
            raise RagrlError(f"retriever URL must start with http:// or https://, got {url!r}")
        if retries < 0 or backoff < 0 or timeout <= 0 or batch_size < 1:
            raise RagrlError(
                "HttpRetriever needs timeout > 0, retries >= 0, backoff >= 0 and batch_size >= 1, got "
                f"timeout={timeout}, retries={retries}, backoff={backoff}, batch_size={batch_size}"
            )
        self.url = base
        self.timeout, self.retries, self.backoff, self.batch_size = timeout, retries, backoff, batch_size
        self._owns_client = client is None
        self._client = client if client is not None else httpx.Client(timeout=timeout)
        self._fingerprint = fingerprint
        self._health: dict[str, Any] | None = None

    # -- HTTP --------------------------------------------------------------------------------------

    def _request(self, method: str, path: str, payload: Any = None) -> Any:
        import httpx

        url = f"{self.url}{path}"
        if self._client.is_closed:
            raise RagrlError(f"{method} {url}: the retriever was closed")
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                response = self._client.request(method, url, json=payload)
            except httpx.TransportError as e:  # connection refused/reset, timeouts, protocol errors
                last = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
                continue
            if response.status_code >= 500:
                last = f"HTTP {response.status_code}: {_snippet(response.text)}"
                continue
            if response.status_code >= 400:
                raise RagrlError(
                    f"{method} {url} failed with HTTP {response.status_code}: {_snippet(response.text)}"
                )
            try:
                return response.json()
            except ValueError:
                raise RagrlError(
                    f"{method} {url}: the response is not JSON (HTTP {response.status_code}): "
                    f"{_snippet(response.text)}"
                ) from None
        tries = self.retries + 1
        raise ServerUnreachable(f"{method} {url} failed after {tries} attempt{'s' * (tries > 1)}: {last}")

    # -- protocol ----------------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """The server's ``GET /health`` answer (fetched once, then kept)."""
        if self._health is None:
            answer = self._request("GET", "/health")
            if not isinstance(answer, dict):
                raise RagrlError(
                    f"GET {self.url}/health: expected a JSON object, got {_snippet(str(answer))}"
                )
            self._health = answer
        return self._health

    @property
    def fingerprint(self) -> str:
        if self._fingerprint is None:
            try:
                fingerprint = self.health().get("fingerprint")
            except RagrlError as e:
                raise RagrlError(
                    f"{e} (the retriever's fingerprint comes from /health; for a server without it "
                    "pass HttpRetriever(..., fingerprint=...))"
                ) from None
            if not isinstance(fingerprint, str) or not fingerprint:
                raise RagrlError(
                    f"GET {self.url}/health reports no fingerprint; pass HttpRetriever(..., fingerprint=...)"
                )
            self._fingerprint = fingerprint
        return self._fingerprint

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        check_k(k)
        queries = list(queries)
        out: list[list[Hit]] = []
        for start in range(0, len(queries), self.batch_size):
            batch = queries[start : start + self.batch_size]
            answer = self._request("POST", "/retrieve", {"queries": batch, "topk": k, "return_scores": True})
            result = answer.get("result") if isinstance(answer, dict) else None
            if not isinstance(result, list) or len(result) != len(batch):
                got = f"{len(result)} lists" if isinstance(result, list) else _snippet(str(answer))
                raise RagrlError(
                    f"POST {self.url}/retrieve: expected {{'result': [...]}} with one list per query "
                    f"({len(batch)}), got {got}"
                )
            for query, items in zip(batch, result, strict=True):
                out.append(self._hits(query, items, k))
        return out

    def _hits(self, query: str, items: Any, k: int) -> list[Hit]:
        where = f"POST {self.url}/retrieve: query {query!r}"
        if not isinstance(items, list):
            raise RagrlError(f"{where}: expected a list of results, got {_snippet(str(items))}")
        hits = []
        for i, item in enumerate(items[:k]):
            if not isinstance(item, dict) or not isinstance(item.get("document"), dict):
                raise RagrlError(
                    f"{where}: result {i} is not {{'document': {{...}}, 'score': s}}: {_snippet(str(item))}"
                )
            try:
                score = float(item["score"])
            except (KeyError, TypeError, ValueError):
                raise RagrlError(
                    f"{where}: result {i} has no numeric 'score': {_snippet(str(item))}"
                ) from None
            hits.append(Hit(self._passage(item["document"], f"{where}: result {i}"), score))
        return hits

    @staticmethod
    def _passage(doc: dict[str, Any], where: str) -> Passage:
        title, text = doc.get("title"), doc.get("text")
        if isinstance(title, str) and isinstance(text, str):
            passage = Passage(str(doc.get("id", "")), title, text)
        elif isinstance(doc.get("contents"), str):
            title = doc.get("title") if isinstance(doc.get("title"), str) else None
            passage = Passage.from_contents(str(doc.get("id", "")), doc["contents"], title)
        else:
            raise RagrlError(f"{where}: document has neither 'contents' nor 'title' and 'text': {doc}")
        if doc.get("id") is None or passage.id == "":
            passage = Passage.make(passage.title, passage.text)
        return passage

    def save(self, directory: str | Path) -> None:
        raise RagrlError(f"{self.url}: an HTTP retriever has no index to save (save it where it is served)")

    # -- lifetime ----------------------------------------------------------------------------------

    def close(self) -> None:
        if self._owns_client:
            self._client.close()

    def __enter__(self) -> HttpRetriever:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"HttpRetriever({self.url!r})"
