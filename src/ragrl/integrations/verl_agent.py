"""ragrl's rollout as verl's agent loop, and ragrl's retrievers as a verl tool (docs/scale.md).

Imports verl: it is loaded by verl's workers from their config, never by ragrl itself.

**The agent loop** (``RagrlAgentLoop``). verl hands an agent loop one dataset row and a client of its
rollout servers; ragrl's loop plays the row's question with the method's own rollout
(``Method.make_rollout``: its protocol's tags, observation text, correctives and budgets), over a
generation backend whose every call is one request to verl's servers. What verl gets back is the
episode's own record: the prompt ids, the completion ids, the loss mask as ``response_mask`` (1 on the
policy's tokens, 0 on every observation token) and the servers' log-probs. The episode is scored where
it was played, by the method's reward on the typed ``Trajectory`` (``reward_score``; verl then skips its
own reward function), so nothing is parsed back out of decoded text and a protocol that prefills the
answer (TIRESRAG-R1's ``<think>``) works too. Only the linear rollout (``rollout.kind: multi_turn``) is
played: a step-wise or tree rollout makes several samples of one episode, which one verl row cannot
hold. verl's YAML for it (``actor_rollout_ref.rollout.agent.agent_loop_config_path``)::

    - name: ragrl_agent
      _target_: ragrl.integrations.verl_agent.RagrlAgentLoop
      method: search_r1              # a packaged method or a config path
      overrides: []                  # --set style
      index: /data/wiki-bm25         # a ragrl index directory, or
      # url: http://10.0.0.5:8000    # a `ragrl serve` address

and the rows' ``agent_name: ragrl_agent`` (``write_parquet(..., agent_name="ragrl_agent")``). Sampling
(temperature, top-p, top-k, log-probs) is verl's, from its rollout config; the stop strings and each
turn's token allowance are the protocol's and the rollout's, sent as vLLM's sampling keys (SGLang's
differ: not supported yet). What the loop refuses when it is built: ``skip_tokenizer_init`` (verl's
default; a server without its tokenizer cannot match stop strings), a ``rollout.max_total_tokens``
above verl's ``response_length`` (an episode is never cut after it was scored); and when it runs, a
prompt longer than verl's ``prompt_length``. Episodes run in threads of their own (``EXECUTOR``), each
waiting on the servers; a request the server aborts ends its turn as cut (``ragrl_aborted``).

**The tool** (``RagrlSearchTool``): a verl ``BaseTool`` for verl's own tool-calling loop. It searches
through a ragrl index or a ``ragrl serve`` URL and answers with the method's observation text (for
Search-R1, ``Doc 1 (Title: T) text`` lines), the same passages ``ragrl search`` returns.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from ragrl.config import Method
from ragrl.errors import RagrlError
from ragrl.integrations.verl import _example, loaded_method
from ragrl.llm.backend import Generation, SamplingParams, model_eos_ids
from ragrl.retrieval.base import Retriever, load_retriever
from ragrl.retrieval.http import HttpRetriever
from ragrl.rewards import RewardContext
from ragrl.rollout.trajectory import Action

_LOCK = threading.Lock()
_OPENED: dict[tuple[Any, ...], Any] = {}


def _once(key: tuple[Any, ...], make: Any) -> Any:
    """``make()``, once per process and key: verl builds an agent loop for every row."""
    with _LOCK:
        if key not in _OPENED:
            _OPENED[key] = make()
        return _OPENED[key]


def agent_method(name: str, overrides: Sequence[str] = ()) -> Method:
    """The method, loaded once per process and (name, overrides); a rollout verl cannot hold refused."""
    method = loaded_method(name, overrides)
    if method.rollout.kind != "multi_turn":
        raise RagrlError(
            f"{name}: rollout.kind {method.rollout.kind!r} makes several samples of one episode; "
            "verl's agent loop returns one sequence a row (only multi_turn is played)"
        )
    return method


def agent_retriever(index: str | None = None, url: str | None = None) -> Retriever:
    """A ragrl index directory or a ``ragrl serve`` URL, opened once per process."""
    if (index is None) == (url is None):
        raise RagrlError("the ragrl agent loop and tool need exactly one of index (a directory) or url")
    return _once(
        ("retriever", index, url), lambda: load_retriever(index) if index else HttpRetriever(str(url))
    )


def _eos_ids(model_path: Any, tokenizer: Any) -> frozenset[int]:
    """The model's EOS ids (its tokenizer's and its generation config's), read once per model: verl
    builds an agent loop for every row. A model path that is not a local folder (a hub id) gives the
    generation config only if it is cached on this node."""
    key = str(model_path or getattr(tokenizer, "name_or_path", ""))
    return _once(("eos", key), lambda: model_eos_ids(key, tokenizer))


EXECUTOR = ThreadPoolExecutor(max_workers=1024, thread_name_prefix="ragrl-agent-loop")
"""The threads the episodes run in: one an episode in flight, held while it waits on the servers, so not
the event loop's default pool (whose few threads verl's own loops and tracing also need)."""


class ServerBackend:
    """A ragrl ``GenerationBackend`` over verl's rollout servers, for a rollout running in a worker
    thread: each prompt is one ``server_manager.generate`` request, awaited on the agent loop's event
    loop. verl's sampling settings are kept; the stop strings and the token allowance are ragrl's
    (vLLM's sampling keys: the servers must have their tokenizer to match stop strings)."""

    def __init__(
        self,
        server_manager: Any,
        tokenizer: Any,
        sampling_params: dict[str, Any],
        loop: Any,
        request_id: str,
        *,
        eos_ids: frozenset[int] = frozenset(),
        timeout: float | None = None,
    ) -> None:
        self.server_manager = server_manager
        self.tokenizer = tokenizer
        self.sampling_params = dict(sampling_params)
        self.loop = loop
        self.request_id = request_id
        self.eos_ids = eos_ids
        self.timeout = timeout
        self.with_logprobs = True
        """False once a reply came without log-probs (verl's ``calculate_log_probs`` off)."""
        self.aborted = False
        self.extra_fields: dict[str, Any] = {}
        """The steps of the weights the servers sampled the episode with (``min_global_steps``,
        ``max_global_steps`` over its requests); a reply's other fields describe that request only."""

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        calls = [asyncio.run_coroutine_threadsafe(self._one(list(p), params), self.loop) for p in prompts]
        try:
            return [call.result(timeout=self.timeout) for call in calls]
        except FutureTimeout:
            raise RagrlError(
                f"verl's rollout server did not answer request {self.request_id} in {self.timeout} s"
            ) from None

    async def _one(self, prompt: list[int], params: SamplingParams) -> Generation:
        sampling = {
            **self.sampling_params,
            "max_tokens": params.max_new_tokens,
            "stop": list(params.stop),
            "include_stop_str_in_output": True,
        }
        if params.stop_token_ids:
            sampling["stop_token_ids"] = list(params.stop_token_ids)
        out = await self.server_manager.generate(
            request_id=self.request_id, prompt_ids=prompt, sampling_params=sampling
        )
        self._keep(out.extra_fields or {})
        if out.log_probs is None and out.stop_reason != "aborted":  # an aborted reply never has them
            self.with_logprobs = False
        generation = self.generation(list(out.token_ids), out.log_probs, params)
        if out.stop_reason == "aborted":  # the server gave up on it (a weight update): cut here
            self.aborted = True
            generation = Generation(generation.token_ids, generation.logprobs, "length")
        return generation

    def _keep(self, fields: dict[str, Any]) -> None:
        for key, pick in (("min_global_steps", min), ("max_global_steps", max)):
            value, kept = fields.get(key), self.extra_fields.get(key)
            if value is not None:  # None until the server's weights were synced with a step
                self.extra_fields[key] = value if kept is None else pick(kept, value)

    def generation(self, ids: list[int], logprobs: list[float] | None, params: SamplingParams) -> Generation:
        """What the server's tokens are to ragrl (verl's reply says only "completed"): ended by a stop
        string (kept in the text; the token that completed it may carry more), by a stop token, by EOS
        (the tokenizer's or the model's generation config's), or by the token allowance."""
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        logprobs = [float(x) for x in logprobs] if logprobs else [0.0] * len(ids)
        found = [(text.find(s), s) for s in params.stop if s and s in text]
        if found:
            return Generation(ids, logprobs, "stop", min(found)[1])
        if ids and ids[-1] in params.stop_token_ids:
            return Generation(ids, logprobs, "stop", ids[-1])
        if ids and ids[-1] in self.eos_ids:
            return Generation(ids, logprobs, "eos", ids[-1])
        return Generation(ids, logprobs, "length")


class RagrlAgentLoop(AgentLoopBase):
    """verl's agent loop playing a ragrl method's rollout (the module's docstring has its config)."""

    def __init__(
        self,
        *args: Any,
        method: str = "search_r1",
        overrides: Sequence[str] = (),
        index: str | None = None,
        url: str | None = None,
        request_timeout: float = 1800.0,
        **kwargs: Any,
    ) -> None:
        kwargs.pop("tools", None)  # verl's tool-calling tools: ragrl's protocol searches itself
        super().__init__(*args, **kwargs)
        self.method = agent_method(method, list(overrides))
        self.retriever = agent_retriever(index, url)
        self.prompt_length = int(self.rollout_config.prompt_length)
        self.response_length = int(self.rollout_config.response_length)
        self.request_timeout = float(request_timeout)
        budget = self.method.rollout.max_total_tokens
        if budget > self.response_length:
            raise RagrlError(
                f"{method}: rollout.max_total_tokens ({budget}) is more than verl's actor_rollout_ref."
                f"rollout.response_length ({self.response_length}): an episode would be cut after it was "
                "scored; lower the one or raise the other"
            )
        if self.rollout_config.get("skip_tokenizer_init", False):
            raise RagrlError(
                "the ragrl agent loop stops each turn at the protocol's stop strings, which a rollout server "
                "without its tokenizer cannot match: set actor_rollout_ref.rollout.skip_tokenizer_init=False"
            )
        self.eos_ids = _eos_ids(self.config.actor_rollout_ref.model.get("path"), self.tokenizer)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        extra_info = kwargs.get("extra_info")
        example = _example((kwargs.get("reward_model") or {}).get("ground_truth"), extra_info, 0)
        if not example.question:
            raise RagrlError(
                "the ragrl agent loop needs rows written by write_parquet (extra_info.ragrl_example)"
            )
        (example,) = self.method.prepare_examples([example], "verl row")
        request_id = uuid4().hex
        loop = asyncio.get_running_loop()
        backend = ServerBackend(
            self.server_manager, self.tokenizer, sampling_params, loop, request_id,
            eos_ids=self.eos_ids, timeout=self.request_timeout,
        )  # fmt: skip
        one = dataclasses.replace(self.method.rollout, n=1)  # verl repeats a row for its groups
        rollout = self.method.make_rollout(backend, self.retriever, one)
        (trajectory,) = await loop.run_in_executor(EXECUTOR, rollout.run, [example], 1)
        if len(trajectory.prompt_ids) > self.prompt_length:
            raise RagrlError(
                f"question {example.id}: its prompt is {len(trajectory.prompt_ids)} tokens, more than verl's "
                f"actor_rollout_ref.rollout.prompt_length ({self.prompt_length}); raise it, or cut questions "
                "with rollout.max_question_chars"
            )
        score = self.method.reward.score
        (result,) = await loop.run_in_executor(EXECUTOR, score, [trajectory], [example], RewardContext())
        return AgentLoopOutput(
            prompt_ids=list(trajectory.prompt_ids),
            response_ids=list(trajectory.completion_ids),
            response_mask=list(trajectory.loss_mask),
            response_logprobs=list(trajectory.completion_logprobs) if backend.with_logprobs else None,
            reward_score=float(result.total),
            num_turns=2 * sum(1 for s in trajectory.segments if s.kind == "policy"),
            metrics=AgentLoopMetrics(),
            extra_fields={
                **backend.extra_fields,
                "turn_scores": [],
                "tool_rewards": [],
                "ragrl_finish_reason": trajectory.finish_reason,
                "ragrl_aborted": backend.aborted,
                "ragrl_searches": sum(1 for a in trajectory.actions if a.kind == "search"),
                **{f"ragrl_{k}": float(v) for k, v in result.components.items()},
            },
        )


SEARCH_SCHEMA = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the corpus; returns the passages found.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string", "description": "the search query"}},
            "required": ["query"],
        },
    },
}


class RagrlSearchTool(BaseTool):
    """A verl tool that searches through a ragrl retriever. ``config``: ``index`` (a directory) or
    ``url`` (``ragrl serve``), ``topk`` (default 3), ``method`` (whose observation text formats the
    passages, default ``search_r1``) and its ``overrides``."""

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None = None) -> None:
        schema = tool_schema or OpenAIFunctionToolSchema.model_validate(SEARCH_SCHEMA)
        super().__init__(config, schema)
        self.retriever = agent_retriever(config.get("index"), config.get("url"))
        self.topk = int(config.get("topk", 3))
        self.protocol = loaded_method(
            config.get("method", "search_r1"), list(config.get("overrides", []))
        ).protocol

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict]:
        query = str(parameters.get("query", "")).strip()
        if not query:
            return ToolResponse(text="No query given: call search with a non-empty query."), 0.0, {"hits": 0}
        (hits,) = await asyncio.to_thread(self.retriever.search, [query], self.topk)
        text = self.protocol.observation(Action(kind="search", content=query), hits)
        return ToolResponse(text=text), 0.0, {"hits": len(hits)}
