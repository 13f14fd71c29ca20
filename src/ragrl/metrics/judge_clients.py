"""Judge clients: anything that answers chat messages with the assistant's reply text, for LLM-judge
metrics and rewards (ARENA's LJ, TIRESRAG-R1's sufficiency / reasoning / reflection judges, EVO-RAG's
evidence verifier).

* ``OpenAIJudge``: any OpenAI-compatible ``POST /v1/chat/completions`` endpoint (OpenAI, vLLM,
  SGLang, llama.cpp ...), through httpx, with retries; ``complete_batch`` sends up to ``concurrency``
  requests at once and keeps the order.
* ``LocalJudge``: a local transformers causal LM, greedy, through its chat template; ``complete_batch``
  is one batched generation.
* ``CachedJudge``: wraps either; a request seen before (same client, same messages) is answered from
  the cache, in memory and optionally in a jsonl file that survives the process (a training run
  re-scoring the same episodes, a resumed run), and only the misses reach the client, in one batch.

``make_judge(spec)`` builds one from a config mapping.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ragrl.console import console
from ragrl.errors import DataError, RagrlError

if TYPE_CHECKING:
    import httpx

    from ragrl.llm.backend import GenerationBackend

_SNIPPET = 300  # characters of a failed response's body quoted in errors


def snippet(text: str) -> str:
    """``text`` on one line, cut to 300 characters (for error messages)."""
    text = " ".join(text.split())
    return text if len(text) <= _SNIPPET else text[:_SNIPPET] + "…"


@runtime_checkable
class JudgeClient(Protocol):
    """Anything that answers a list of chat messages with the assistant's reply text."""

    def complete(self, messages: list[dict[str, str]]) -> str: ...


def _chat_url(base_url: str) -> str:
    """``http://h:8000`` → ``http://h:8000/v1/chat/completions``; ``…/v1`` → ``…/v1/chat/completions``;
    a URL already ending in ``/chat/completions`` is kept."""
    url = str(base_url).strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise RagrlError(f"judge base_url must start with http:// or https://, got {base_url!r}")
    if url.endswith("/chat/completions"):
        return url
    if url.endswith("/v1"):
        return url + "/chat/completions"
    return url + "/v1/chat/completions"


class OpenAIJudge:
    """A judge behind an OpenAI-compatible ``POST /v1/chat/completions`` endpoint, through httpx.

    ``base_url`` is the server (``http://localhost:8000``), its ``/v1`` root
    (``https://api.openai.com/v1``) or the full ``…/chat/completions`` URL. The API key is read from
    the environment variable ``api_key_env`` (default ``OPENAI_API_KEY``) when the judge is built and
    sent as ``Authorization: Bearer …``; when the variable is unset (or ``api_key_env`` is None) no
    header is sent, which is what a local vLLM server expects.

    Connection errors, timeouts, HTTP 429 and 5xx are retried ``max_retries`` times, waiting
    ``backoff * 2**attempt`` seconds (or the server's numeric ``Retry-After``, at most
    ``max_wait``). Any other HTTP error, a reply that is not a chat completion, or running out of
    retries raises a ``RagrlError`` naming the URL and the status. ``client`` takes a ready
    ``httpx.Client`` (its own timeout applies; ``close()`` leaves it open).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key_env: str | None = "OPENAI_API_KEY",
        temperature: float = 0.0,
        max_tokens: int | None = None,
        timeout: float = 60.0,
        max_retries: int = 5,
        backoff: float = 1.0,
        max_wait: float = 60.0,
        concurrency: int = 8,
        client: httpx.Client | None = None,
    ) -> None:
        try:
            import httpx
        except ImportError:
            raise RagrlError("the OpenAI-compatible judge needs httpx: pip install 'ragrl[server]'") from None
        if not model:
            raise RagrlError("OpenAIJudge: model is empty; name the judge model (e.g. gpt-4o-2024-11-20)")
        if timeout <= 0 or max_retries < 0 or backoff < 0 or max_wait < 0:
            raise RagrlError(
                "OpenAIJudge needs timeout > 0, max_retries >= 0, backoff >= 0 and max_wait >= 0, got "
                f"timeout={timeout}, max_retries={max_retries}, backoff={backoff}, max_wait={max_wait}"
            )
        if concurrency < 1:
            raise RagrlError(f"OpenAIJudge: concurrency must be >= 1, got {concurrency}")
        self.concurrency = concurrency
        if max_tokens is not None and max_tokens < 1:
            raise RagrlError(f"OpenAIJudge: max_tokens must be >= 1 or None, got {max_tokens}")
        self.url = _chat_url(base_url)
        self.model = model
        self.api_key_env = api_key_env
        self.temperature = float(temperature)
        self.max_tokens = max_tokens
        self.timeout, self.max_retries, self.backoff, self.max_wait = timeout, max_retries, backoff, max_wait
        api_key = os.environ.get(api_key_env) if api_key_env else None
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._owns_client = client is None
        self._client = client if client is not None else httpx.Client(timeout=timeout)

    def _wait(self, attempt: int, retry_after: str | None) -> float:
        wait = self.backoff * 2 ** (attempt - 1)
        if retry_after:
            try:
                wait = max(wait, float(retry_after))
            except ValueError:  # an HTTP date: fall back to our own schedule
                pass
        return min(wait, self.max_wait)

    def complete(self, messages: list[dict[str, str]]) -> str:
        """The assistant reply (``choices[0].message.content``) to ``messages``."""
        import httpx

        payload: dict[str, Any] = {"model": self.model, "messages": messages, "temperature": self.temperature}
        if self.max_tokens is not None:
            payload["max_tokens"] = self.max_tokens
        last, retry_after = "", None
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(self._wait(attempt, retry_after))
            retry_after = None
            try:
                response = self._client.post(self.url, json=payload, headers=self._headers)
            except httpx.TransportError as e:  # connection refused/reset, timeouts, protocol errors
                last = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
                continue
            status = response.status_code
            if status == 429 or status >= 500:
                last = f"HTTP {status}: {snippet(response.text)}"
                retry_after = response.headers.get("retry-after")
                continue
            if status >= 400:
                hint = ""
                if status in (401, 403):
                    where = f"${self.api_key_env}" if self.api_key_env else "the environment"
                    state = "is set" if self._headers else "is not set"
                    hint = f" (the API key comes from {where}, which {state})"
                raise RagrlError(
                    f"judge POST {self.url} failed with HTTP {status}: {snippet(response.text)}{hint}"
                )
            return self._content(response)
        tries = self.max_retries + 1
        raise RagrlError(f"judge POST {self.url} failed after {tries} attempt{'s' * (tries > 1)}: {last}")

    def complete_batch(self, batch: Sequence[list[dict[str, str]]]) -> list[str]:
        """One reply per message list, in order, with up to ``concurrency`` requests in flight (each
        retried on its own); the first request that fails for good raises its error."""
        if len(batch) <= 1 or self.concurrency == 1:
            return [self.complete(list(m)) for m in batch]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(batch))) as pool:
            return list(pool.map(lambda m: self.complete(list(m)), batch))

    def _content(self, response: httpx.Response) -> str:
        where = f"judge POST {self.url} (HTTP {response.status_code})"
        try:
            body = response.json()
        except ValueError:
            raise RagrlError(f"{where}: the response is not JSON: {snippet(response.text)}") from None
        try:
            content = body["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise RagrlError(
                f"{where}: expected {{'choices': [{{'message': {{'content': ...}}}}]}}, got "
                f"{snippet(str(body))}"
            ) from None
        if content is None:  # no text (a reasoning model cut off in its reasoning, a refusal): the
            return ""  # caller reads it as an unreadable reply, as any text it cannot parse
        if not isinstance(content, str):
            raise RagrlError(f"{where}: the reply's content is not text: {snippet(str(body))}")
        return content

    def close(self) -> None:
        if self._owns_client:
            self._client.close()

    def __enter__(self) -> OpenAIJudge:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:  # names everything that changes a reply (the cache keys on it)
        return (
            f"OpenAIJudge({self.url!r}, model={self.model!r}, temperature={self.temperature}, "
            f"max_tokens={self.max_tokens})"
        )


class LocalJudge:
    """A local causal LM as the judge: greedy decoding through the model's chat template.

    ``model`` is a local model directory (loaded with ``TransformersBackend``: ``from_pretrained``
    with ``local_files_only``; nothing is downloaded) or a ready ``GenerationBackend`` (a
    ``TransformersBackend`` or ``VLLMBackend`` already holding the model). ``complete_batch`` judges
    many prompts in one batched, left-padded generation; greedy decoding makes a reply the same
    whether it is judged alone or in a batch (up to floating-point differences between batch shapes).
    """

    def __init__(
        self,
        model: str | Path | GenerationBackend,
        *,
        device: str = "auto",
        dtype: str = "auto",
        batch_size: int = 16,
        max_new_tokens: int = 16,
    ) -> None:
        if max_new_tokens < 1:
            raise RagrlError(f"LocalJudge: max_new_tokens must be >= 1, got {max_new_tokens}")
        if isinstance(model, str | Path):
            path = Path(model)
            if not path.is_dir():
                raise RagrlError(
                    f"{path}: not a local model directory (the local judge loads models from disk only)"
                )
            from ragrl.llm.hf_backend import TransformersBackend

            self.backend: GenerationBackend = TransformersBackend(
                path, device=device, dtype=dtype, batch_size=batch_size
            )
            self.name = str(path)
        else:
            self.backend = model
            inner = getattr(getattr(model, "model", None), "name_or_path", None)
            self.name = str(inner) if inner else type(model).__name__
        self.max_new_tokens = max_new_tokens

    def complete(self, messages: list[dict[str, str]]) -> str:
        return self.complete_batch([messages])[0]

    def complete_batch(self, batch: Sequence[list[dict[str, str]]]) -> list[str]:
        """One greedy reply per message list, in order."""
        from ragrl.llm.backend import SamplingParams
        from ragrl.llm.chat import encode_messages

        tokenizer = self.backend.tokenizer
        prompts = [encode_messages(list(messages), tokenizer) for messages in batch]
        if not prompts:
            return []
        params = SamplingParams(max_new_tokens=self.max_new_tokens, temperature=0.0)
        generations = self.backend.generate(prompts, params)
        return [tokenizer.decode(g.token_ids, skip_special_tokens=True) for g in generations]

    def __repr__(self) -> str:
        return f"LocalJudge({self.name!r}, max_new_tokens={self.max_new_tokens})"


_OPENAI_KEYS = (
    "base_url",
    "model",
    "api_key_env",
    "temperature",
    "max_tokens",
    "timeout",
    "max_retries",
    "backoff",
    "max_wait",
    "concurrency",
    "cache",
)
_LOCAL_KEYS = ("path", "device", "dtype", "batch_size", "max_new_tokens", "cache")


def make_judge(spec: Mapping[str, Any]) -> JudgeClient:
    """A judge client from a config mapping:

    * ``{"kind": "openai", "base_url": ..., "model": ..., [api_key_env, temperature, max_tokens,
      timeout, max_retries, backoff, max_wait]}`` → ``OpenAIJudge``;
    * ``{"kind": "local", "path": ..., [device, dtype, batch_size, max_new_tokens]}`` → ``LocalJudge``.

    An unknown kind, an unknown key or a missing required key is a ``RagrlError`` naming it.
    """
    spec = dict(spec)
    kind = spec.pop("kind", None)
    if kind == "openai":
        allowed, required = _OPENAI_KEYS, ("base_url", "model")
    elif kind == "local":
        allowed, required = _LOCAL_KEYS, ("path",)
    else:
        raise RagrlError(f"judge spec: unknown kind {kind!r}; expected 'openai' or 'local'")
    unknown = sorted(set(spec) - set(allowed))
    if unknown:
        raise RagrlError(
            f"judge spec (kind {kind!r}): unknown key {', '.join(unknown)}; allowed: {', '.join(allowed)}"
        )
    missing = [k for k in required if spec.get(k) in (None, "")]
    if missing:
        raise RagrlError(f"judge spec (kind {kind!r}): missing {', '.join(missing)}")
    cache = spec.pop("cache", None)
    if kind == "openai":
        judge: JudgeClient = OpenAIJudge(spec.pop("base_url"), spec.pop("model"), **spec)
    else:
        judge = LocalJudge(spec.pop("path"), **spec)
    return CachedJudge(judge, cache) if cache else judge


def complete_all(client: JudgeClient, batch: Sequence[list[dict[str, str]]]) -> list[str]:
    """One reply per message list, in order: one ``complete_batch`` call when the client has one
    (``LocalJudge``, ``OpenAIJudge``, ``CachedJudge``), else one ``complete`` call each."""
    batch_fn = getattr(client, "complete_batch", None)
    replies = list(batch_fn(batch)) if callable(batch_fn) else [client.complete(list(m)) for m in batch]
    if len(replies) != len(batch):
        raise RagrlError(f"judge {client!r} returned {len(replies)} replies for {len(batch)} requests")
    return replies


class CachedJudge:
    """A judge client behind a cache: a request seen before is answered from it, the rest go to the
    client in one ``complete_batch`` (or one ``complete`` each when it has none).

    The key is a SHA-256 of the client's ``repr`` (its URL and model, or its model path) and the
    messages, so one cache file may serve several judges. With ``path``, the new replies of a batch are
    appended to that jsonl file (``{"key", "reply"}`` per line) when the batch returns, and the file is
    read back when the cache is built: a run that re-scores the same episodes, or resumes, does not pay
    twice; an empty reply (a reasoning model cut off before it wrote any text) is not kept. A line
    that is not such a record is a ``DataError`` naming the file and line, except a torn
    last line (a crash in the middle of a write), which is skipped with a warning. ``hits`` and
    ``misses`` count requests. One process writes a cache file at a time.
    """

    def __init__(self, client: JudgeClient, path: str | Path | None = None) -> None:
        self.client = client
        self.path = Path(path) if path else None
        self.hits = self.misses = 0
        self._replies: dict[str, str] = {}
        self._lock = threading.Lock()
        if self.path is not None and self.path.is_file():
            lines = self.path.read_bytes().split(b"\n")
            for line_no, line in enumerate(lines, start=1):
                if not line.strip():
                    continue
                try:  # bytes per line: a crash can also cut a multi-byte character in two
                    record = json.loads(line.decode("utf-8"))
                    self._replies[str(record["key"])] = str(record["reply"])
                except (ValueError, KeyError, TypeError):  # UnicodeDecodeError is a ValueError
                    if line_no == len(lines):  # no newline after it: a write cut short by a crash
                        console.print(f"warning: {self.path}:{line_no}: dropped a torn last record")
                        # cut it off, so the next append starts on a line of its own
                        self.path.write_bytes(b"\n".join(lines[:-1]) + b"\n")
                        continue
                    what = "not a judge cache record {key, reply}"
                    raise DataError(what, path=self.path, line=line_no) from None

    def key(self, messages: list[dict[str, str]]) -> str:
        blob = json.dumps([repr(self.client), messages], sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()

    def complete(self, messages: list[dict[str, str]]) -> str:
        return self.complete_batch([messages])[0]

    def complete_batch(self, batch: Sequence[list[dict[str, str]]]) -> list[str]:
        keys = [self.key(list(m)) for m in batch]
        todo: dict[str, list[dict[str, str]]] = {}
        for k, m in zip(keys, batch, strict=True):
            if k not in self._replies and k not in todo:
                todo[k] = list(m)
        with self._lock:
            self.misses += len(todo)
            self.hits += len(keys) - len(todo)
        fresh = dict(zip(todo, complete_all(self.client, list(todo.values())), strict=True)) if todo else {}
        self._store({k: reply for k, reply in fresh.items() if reply.strip()})
        return [fresh[k] if k in fresh else self._replies[k] for k in keys]

    def _store(self, fresh: dict[str, str]) -> None:
        """Keep the new replies (an empty one is not kept: the next run asks again)."""
        if not fresh:
            return
        with self._lock:
            self._replies.update(fresh)
            if self.path is not None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with self.path.open("a", encoding="utf-8") as f:
                    for k, reply in fresh.items():
                        f.write(json.dumps({"key": k, "reply": reply}, ensure_ascii=False) + "\n")

    def __repr__(self) -> str:
        return repr(self.client)
