"""LLM-as-a-judge: ARENA's LJ metric (arena.md §5.3) and its judge-accuracy reward variant (§2.6).

A judge model gets a system message (``JUDGE_SYSTEM``) and one user message built by ``judge_prompt``
from the gold labels and the *extracted answer* (not the whole response). Its reply is scored by
``parse_judgement``:

* ARENA's evaluation rule (``src/gpt_eval.py``): ``'yes' in reply.lower()`` → 1.0; elif
  ``'no' in reply.lower()`` → 0.0; else 0.5.
* These are **substring** tests, as in the repo: "I don't know" contains ``no`` (in "know") and
  scores 0.0, "Not sure" scores 0.0, "eyes" would score 1.0, and "yes and no" scores 1.0 because
  ``yes`` is tested first. ``strict=True`` tests whole words instead (``\\byes\\b``, ``\\bno\\b``), so
  "I don't know" scores 0.5.
* ``prefix_first=True`` is the reward variant (arena.md §2.6): a reply that *starts* with yes / no
  (after stripping whitespace, case-insensitive) decides first, so "No, yes is wrong" scores 0.0.

``judge_answer`` scores one prediction; an empty (or whitespace-only) prediction scores 0.0 without
calling the judge, as ARENA does. ``judge_answers`` scores many, batching through the client's
``complete_batch`` when it has one (``LocalJudge``). Clients: ``OpenAIJudge`` (any OpenAI-compatible
``/v1/chat/completions`` endpoint: OpenAI, vLLM, SGLang, llama.cpp ...) and ``LocalJudge`` (a local
transformers causal LM, greedy, through its chat template); ``make_judge`` builds one from a config
mapping. The paper's judge is ``gpt-4o-2024-11-20`` at temperature 0.0.

The banners of ``JUDGE_TEMPLATE`` are our own wording of the paper's Table 8 with the repo's layout:
each banner wrapped in 13 asterisks on each side, blocks separated by ``"\\n\\n\\n\\n"``,
``{correct_answer}`` = ``str(list_of_labels)``.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ragrl.errors import RagrlError

if TYPE_CHECKING:
    import httpx

    from ragrl.llm.backend import GenerationBackend

__all__ = [
    "JUDGE_SYSTEM",
    "JUDGE_TEMPLATE",
    "JudgeClient",
    "LocalJudge",
    "OpenAIJudge",
    "judge_answer",
    "judge_answers",
    "judge_messages",
    "judge_prompt",
    "make_judge",
    "parse_judgement",
]

JUDGE_SYSTEM = "You are an intelligent AI assistant."
"""ARENA's system message for the judge (arena.md §5.3)."""

_STARS = "*" * 13
_BLOCK_SEP = "\n\n\n\n"

JUDGE_TEMPLATE = _BLOCK_SEP.join(
    [
        f"{_STARS}This is a knowledge question-answering task with retrieved passages (RAG), used to "
        f"evaluate a model. The list of correct answers is:{_STARS}\n{{correct_answer}}",
        f"{_STARS}The model's answer is:{_STARS}\n{{model_response}}",
        f"{_STARS}Is the model's answer correct? It counts as correct if it matches any item in the "
        f'correct answer list, or a synonym of one. Reply with only "yes" or "no".{_STARS}',
    ]
)
"""The default judge prompt. Placeholders: ``{correct_answer}``, ``{model_response}`` (both required)
and ``{question}`` (optional; ARENA's prompt does not use it)."""

_PLACEHOLDER = re.compile(r"\{(correct_answer|model_response|question)\}")
_REQUIRED = ("{correct_answer}", "{model_response}")
_YES_WORD = re.compile(r"\byes\b")
_NO_WORD = re.compile(r"\bno\b")
_SNIPPET = 300  # characters of a failed response's body quoted in errors


def _snippet(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _SNIPPET else text[:_SNIPPET] + "…"


def _labels(answers: str | Sequence[str]) -> list[str]:
    labels = [answers] if isinstance(answers, str) else [str(a) for a in answers]
    if not labels:
        raise RagrlError("judge prompt: no gold answers to judge against (answers is empty)")
    return labels


# -- prompt and parsing ----------------------------------------------------------------------------


def judge_prompt(
    answers: str | Sequence[str],
    prediction: str,
    template: str | None = None,
    *,
    question: str = "",
) -> str:
    """The judge's user message: ``template`` (default ``JUDGE_TEMPLATE``) with ``{correct_answer}``
    = ``str(list_of_labels)``, ``{model_response}`` = ``prediction`` (the extracted answer only) and
    ``{question}`` = ``question``.

    Substitution is a single pass over the template, so braces inside the answers or the prediction
    are copied as they are and never substituted again; other braces in the template are literal.
    A template missing ``{correct_answer}`` or ``{model_response}`` is a ``RagrlError``.
    """
    template = JUDGE_TEMPLATE if template is None else template
    missing = [p for p in _REQUIRED if p not in template]
    if missing:
        raise RagrlError(
            f"judge template: missing placeholder {', '.join(missing)} in {_snippet(template)!r}"
        )
    values = {
        "correct_answer": str(_labels(answers)),
        "model_response": prediction,
        "question": question,
    }
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], template)


def judge_messages(
    answers: str | Sequence[str],
    prediction: str,
    template: str | None = None,
    *,
    question: str = "",
    system: str = JUDGE_SYSTEM,
) -> list[dict[str, str]]:
    """``[{"role": "system", ...}, {"role": "user", judge_prompt(...)}]``, what a judge client gets."""
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": judge_prompt(answers, prediction, template, question=question)},
    ]


def parse_judgement(text: str, *, strict: bool = False, prefix_first: bool = False) -> float:
    """Score a judge reply: 1.0 (yes), 0.0 (no) or 0.5 (neither), ARENA's rule (see the module
    docstring for the substring quirk).

    ``strict``: whole-word tests (``\\byes\\b`` / ``\\bno\\b``) instead of substrings.
    ``prefix_first``: the reward variant (arena.md §2.6); a reply starting with ``yes`` / ``no``
    (stripped, case-insensitive) decides before the containment tests.
    """
    lower = text.lower()
    if prefix_first:
        head = lower.strip()
        if head.startswith("yes"):
            return 1.0
        if head.startswith("no"):
            return 0.0
    if strict:
        if _YES_WORD.search(lower):
            return 1.0
        if _NO_WORD.search(lower):
            return 0.0
        return 0.5
    if "yes" in lower:
        return 1.0
    if "no" in lower:
        return 0.0
    return 0.5


# -- clients ---------------------------------------------------------------------------------------


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
                last = f"HTTP {status}: {_snippet(response.text)}"
                retry_after = response.headers.get("retry-after")
                continue
            if status >= 400:
                hint = ""
                if status in (401, 403):
                    where = f"${self.api_key_env}" if self.api_key_env else "the environment"
                    state = "is set" if self._headers else "is not set"
                    hint = f" (the API key comes from {where}, which {state})"
                raise RagrlError(
                    f"judge POST {self.url} failed with HTTP {status}: {_snippet(response.text)}{hint}"
                )
            return self._content(response)
        tries = self.max_retries + 1
        raise RagrlError(f"judge POST {self.url} failed after {tries} attempt{'s' * (tries > 1)}: {last}")

    def _content(self, response: httpx.Response) -> str:
        where = f"judge POST {self.url} (HTTP {response.status_code})"
        try:
            body = response.json()
        except ValueError:
            raise RagrlError(f"{where}: the response is not JSON: {_snippet(response.text)}") from None
        try:
            content = body["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise RagrlError(
                f"{where}: expected {{'choices': [{{'message': {{'content': ...}}}}]}}, got "
                f"{_snippet(str(body))}"
            ) from None
        if not isinstance(content, str):
            raise RagrlError(f"{where}: the reply has no text content: {_snippet(str(body))}")
        return content

    def close(self) -> None:
        if self._owns_client:
            self._client.close()

    def __enter__(self) -> OpenAIJudge:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"OpenAIJudge({self.url!r}, model={self.model!r})"


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
            self.name = type(model).__name__
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
        return f"LocalJudge({self.name!r})"


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
)
_LOCAL_KEYS = ("path", "device", "dtype", "batch_size", "max_new_tokens")


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
    if kind == "openai":
        return OpenAIJudge(spec.pop("base_url"), spec.pop("model"), **spec)
    return LocalJudge(spec.pop("path"), **spec)


# -- scoring ---------------------------------------------------------------------------------------


def judge_answer(
    question: str,
    answers: str | Sequence[str],
    prediction: str,
    *,
    client: JudgeClient,
    cache: dict[str, str] | None = None,
    template: str | None = None,
    strict: bool = False,
    prefix_first: bool = False,
) -> float:
    """The judge's score of ``prediction`` (the extracted answer) against ``answers``: 1.0, 0.5 or 0.0.

    An empty or whitespace-only prediction scores 0.0 and the judge is not called (ARENA: a missing
    ``<answer>`` tag scores 0 on every metric). ``question`` fills ``{question}`` in templates that use
    it (the default does not). ``cache`` maps the user prompt to the judge's raw reply: a prompt seen
    before is not sent again, and the reply is re-parsed with the current ``strict`` / ``prefix_first``.
    Use one cache per judge model. See ``parse_judgement`` for ``strict`` and ``prefix_first``.
    """
    if not prediction.strip():
        return 0.0
    messages = judge_messages(answers, prediction, template, question=question)
    prompt = messages[-1]["content"]
    if cache is not None and prompt in cache:
        reply = cache[prompt]
    else:
        reply = client.complete(messages)
        if cache is not None:
            cache[prompt] = reply
    return parse_judgement(reply, strict=strict, prefix_first=prefix_first)


def judge_answers(
    questions: Sequence[str],
    answers: Sequence[str | Sequence[str]],
    predictions: Sequence[str],
    *,
    client: JudgeClient,
    cache: dict[str, str] | None = None,
    template: str | None = None,
    strict: bool = False,
    prefix_first: bool = False,
) -> list[float]:
    """``judge_answer`` over parallel lists, in order. The prompts not in ``cache`` (and not empty
    predictions) go to the judge once each, in one ``complete_batch`` call when the client has one
    (``LocalJudge``), else one ``complete`` call each."""
    if not len(questions) == len(answers) == len(predictions):
        raise RagrlError(
            f"judge_answers: questions ({len(questions)}), answers ({len(answers)}) and predictions "
            f"({len(predictions)}) must have the same length"
        )
    prompts: list[str | None] = []
    todo: dict[str, list[dict[str, str]]] = {}
    for question, labels, prediction in zip(questions, answers, predictions, strict=True):
        if not prediction.strip():
            prompts.append(None)
            continue
        messages = judge_messages(labels, prediction, template, question=question)
        prompt = messages[-1]["content"]
        prompts.append(prompt)
        if (cache is None or prompt not in cache) and prompt not in todo:
            todo[prompt] = messages
    batch_fn = getattr(client, "complete_batch", None)
    if callable(batch_fn) and todo:
        replies = list(batch_fn(list(todo.values())))
        if len(replies) != len(todo):
            raise RagrlError(
                f"judge {client!r}: complete_batch returned {len(replies)} replies for {len(todo)} prompts"
            )
    else:
        replies = [client.complete(messages) for messages in todo.values()]
    fresh = dict(zip(todo, replies, strict=True))
    if cache is not None:
        cache.update(fresh)
    scores = []
    for prompt in prompts:
        if prompt is None:
            scores.append(0.0)
        else:
            reply = fresh[prompt] if prompt in fresh else cache[prompt]  # type: ignore[index]
            scores.append(parse_judgement(reply, strict=strict, prefix_first=prefix_first))
    return scores
