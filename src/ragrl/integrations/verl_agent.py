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
turn's token allowance are the protocol's and the rollout's.

**The tool** (``RagrlSearchTool``): a verl ``BaseTool`` for verl's own tool-calling loop. It searches
through a ragrl index or a ``ragrl serve`` URL and answers with the method's observation text (for
Search-R1, ``Doc 1 (Title: T) text`` lines), the same passages ``ragrl search`` returns.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Sequence
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from ragrl.config import Method
from ragrl.errors import RagrlError
from ragrl.integrations.verl import _example
from ragrl.llm.backend import Generation, SamplingParams
from ragrl.methods import load_method
from ragrl.retrieval.base import Retriever, load_retriever
from ragrl.retrieval.http import HttpRetriever
from ragrl.rewards import RewardContext
from ragrl.rollout.trajectory import Action

_LOCK = threading.Lock()
_METHODS: dict[tuple[str, tuple[str, ...]], Method] = {}
_RETRIEVERS: dict[tuple[str | None, str | None], Retriever] = {}


def agent_method(name: str, overrides: Sequence[str] = ()) -> Method:
    """The method, loaded once per process and (name, overrides); a rollout verl cannot hold refused."""
    key = (str(name), tuple(str(o) for o in overrides))
    with _LOCK:
        if key not in _METHODS:
            method = load_method(key[0], list(key[1]))
            if method.rollout.kind != "multi_turn":
                raise RagrlError(
                    f"{name}: rollout.kind {method.rollout.kind!r} makes several samples of one episode; "
                    "verl's agent loop returns one sequence a row (only multi_turn is played)"
                )
            _METHODS[key] = method
        return _METHODS[key]


def agent_retriever(index: str | None = None, url: str | None = None) -> Retriever:
    """A ragrl index directory or a ``ragrl serve`` URL, opened once per process."""
    if (index is None) == (url is None):
        raise RagrlError("the ragrl agent loop and tool need exactly one of index (a directory) or url")
    with _LOCK:
        if (index, url) not in _RETRIEVERS:
            _RETRIEVERS[(index, url)] = load_retriever(index) if index else HttpRetriever(str(url))
        return _RETRIEVERS[(index, url)]


class ServerBackend:
    """A ragrl ``GenerationBackend`` over verl's rollout servers, for a rollout running in a worker
    thread: each prompt is one ``server_manager.generate`` request, awaited on the agent loop's event
    loop. verl's sampling settings are kept; the stop strings and the token allowance are ragrl's."""

    def __init__(
        self, server_manager: Any, tokenizer: Any, sampling_params: dict[str, Any], loop: Any, request_id: str
    ) -> None:
        self.server_manager = server_manager
        self.tokenizer = tokenizer
        self.sampling_params = dict(sampling_params)
        self.loop = loop
        self.request_id = request_id
        eos = getattr(tokenizer, "eos_token_id", None)
        self.eos_ids = frozenset([eos] if isinstance(eos, int) else (eos or []))

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        calls = [asyncio.run_coroutine_threadsafe(self._one(list(p), params), self.loop) for p in prompts]
        return [call.result() for call in calls]

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
        if out.stop_reason == "aborted":
            raise RagrlError(f"verl's rollout server aborted request {self.request_id}")
        return self.generation(list(out.token_ids), out.log_probs, params)

    def generation(self, ids: list[int], logprobs: list[float] | None, params: SamplingParams) -> Generation:
        """What the server's tokens are to ragrl: ended by a stop string (kept in the text), by EOS, or
        by the token allowance."""
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        logprobs = [float(x) for x in logprobs] if logprobs else [0.0] * len(ids)
        stop = next((s for s in params.stop if text.endswith(s)), None)
        if stop is not None:
            return Generation(ids, logprobs, "stop", stop)
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
        **kwargs: Any,
    ) -> None:
        kwargs.pop("tools", None)  # verl's tool-calling tools: ragrl's protocol searches itself
        super().__init__(*args, **kwargs)
        self.method = agent_method(method, list(overrides))
        self.retriever = agent_retriever(index, url)
        self.response_length = int(self.rollout_config.response_length)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        extra_info = kwargs.get("extra_info")
        example = _example((kwargs.get("reward_model") or {}).get("ground_truth"), extra_info, 0)
        if not example.question:
            raise RagrlError(
                "the ragrl agent loop needs rows written by write_parquet (extra_info.ragrl_example)"
            )
        (example,) = self.method.prepare_examples([example], "verl row")
        request_id = uuid4().hex
        backend = ServerBackend(
            self.server_manager, self.tokenizer, sampling_params, asyncio.get_running_loop(), request_id
        )
        rollout = self.method.make_rollout(
            backend, self.retriever, dataclasses.replace(self.method.rollout, n=1)
        )
        (trajectory,) = await asyncio.to_thread(rollout.run, [example], 1)
        (result,) = await asyncio.to_thread(
            self.method.reward.score, [trajectory], [example], RewardContext()
        )
        n = min(len(trajectory.completion_ids), self.response_length)
        return AgentLoopOutput(
            prompt_ids=list(trajectory.prompt_ids),
            response_ids=list(trajectory.completion_ids[:n]),
            response_mask=list(trajectory.loss_mask[:n]),
            response_logprobs=list(trajectory.completion_logprobs[:n]),
            reward_score=float(result.total),
            num_turns=2 * sum(1 for s in trajectory.segments if s.kind == "policy"),
            metrics=AgentLoopMetrics(),
            extra_fields={
                "turn_scores": [],
                "tool_rewards": [],
                "ragrl_finish_reason": trajectory.finish_reason,
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
        self.protocol = load_method(
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
