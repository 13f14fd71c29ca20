"""ragrl's rollout as verl's agent loop and ragrl's retriever as a verl tool
(``ragrl.integrations.verl_agent``), with real verl (``make test-verl``, its own virtualenv): the loop is
built the way verl's agent-loop worker builds it (``hydra.utils.instantiate`` of its config, verl's own
trainer config and dataset rows) and gives the same tokens, loss mask and reward as ragrl's rollout of the
same question; the tool returns the passages ``ragrl search`` returns. verl's rollout server is vLLM,
which this environment lacks: the server here is ragrl's transformers backend behind the same request and
reply."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ragrl.cli import app
from ragrl.data.io import read_examples
from ragrl.llm.backend import SamplingParams
from ragrl.llm.hf_backend import TransformersBackend
from ragrl.methods import load_method
from ragrl.retrieval.base import load_retriever
from ragrl.rewards import RewardContext
from ragrl.train.reader import SHIPPED_BASE

pytestmark = pytest.mark.verl


class TransformersServer:
    """verl's rollout server as an agent loop sees it (``generate(request_id, prompt_ids,
    sampling_params) -> TokenOutput``), played by ragrl's transformers backend."""

    def __init__(self, backend: TransformersBackend) -> None:
        self.backend = backend
        self.requests: list[tuple[str, dict]] = []

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict, **_: object):  # noqa: ANN201
        from verl.workers.rollout.replica import TokenOutput

        self.requests.append((request_id, dict(sampling_params)))
        params = SamplingParams(
            max_new_tokens=sampling_params["max_tokens"],
            temperature=sampling_params["temperature"],
            stop=tuple(sampling_params["stop"]),
        )
        (g,) = self.backend.generate([prompt_ids], params)
        return TokenOutput(token_ids=g.token_ids, log_probs=g.logprobs, stop_reason="completed")


@pytest.fixture(scope="module")
def setup(world_dir):  # noqa: ANN001, ANN201
    pytest.importorskip("verl")
    backend = TransformersBackend(str(SHIPPED_BASE), device="cpu")
    examples = read_examples(world_dir / "test.jsonl")[0][:4]
    return backend, examples


def _verl_config(tmp_path: Path):  # noqa: ANN202
    import verl
    from hydra import compose, initialize_config_dir

    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(
            config_name="ppo_trainer",
            overrides=["actor_rollout_ref.rollout.response_length=1024", f"+data.cache_dir={tmp_path}"],
        )


def test_the_agent_loop_plays_ragrls_rollout(setup, world_dir, tmp_path):  # noqa: ANN001
    import hydra
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from ragrl.integrations import verl as rv

    backend, examples = setup
    config = _verl_config(tmp_path)
    path = tmp_path / "rows.parquet"
    rv.write_parquet(examples, path, agent_name="ragrl_agent")
    dataset = RLHFDataset([str(path)], backend.tokenizer, config.data)
    server = TransformersServer(backend)
    agent_config = {  # one entry of verl's agent_loop_config_path YAML
        "_target_": "ragrl.integrations.verl_agent.RagrlAgentLoop",
        "method": "search_r1-tiny",
        "index": str(world_dir / "bm25"),
    }

    def make_loop(**entry: object):  # noqa: ANN202  (as verl's AgentLoopWorker does for every row)
        return hydra.utils.instantiate(
            config={**agent_config, **entry}, trainer_config=DictConfigWrap(config=config),
            server_manager=server, tokenizer=backend.tokenizer, processor=None, dataset_cls=RLHFDataset,
            data_config=DictConfigWrap(config.data), tools=ToolListWrap([]),
        )  # fmt: skip

    method = load_method("search_r1-tiny")
    greedy = dataclasses.replace(method.rollout, n=1, temperature=0.0)
    retriever = load_retriever(world_dir / "bm25")
    searched = 0
    for i, ex in enumerate(examples):
        row = dataset[i]
        assert row["agent_name"] == "ragrl_agent"
        loop = make_loop()
        out = asyncio.run(loop.run({"temperature": 0.0, "top_p": 1.0, "top_k": -1, "logprobs": 0}, **row))
        (expected,) = method.make_rollout(backend, retriever, greedy).run([ex], 1)
        assert out.prompt_ids == expected.prompt_ids
        assert out.response_ids == expected.completion_ids
        assert out.response_mask == expected.loss_mask  # ragrl's loss mask: 0 on every observation token
        assert out.response_logprobs == pytest.approx(expected.completion_logprobs, abs=1e-5)
        (result,) = method.reward.score([expected], [ex], RewardContext())
        assert out.reward_score == result.total and out.extra_fields["ragrl_em"] == result.components["em"]
        assert out.extra_fields["ragrl_finish_reason"] == expected.finish_reason
        searched += out.extra_fields["ragrl_searches"]
        if out.extra_fields["ragrl_searches"]:
            assert 0 in out.response_mask
    assert searched > 0  # the episodes did search: the mask has observation tokens to get right
    ids = {rid for rid, _ in server.requests}
    assert len(ids) == len(examples)  # one request id an episode: its turns stay on one server
    stops = {tuple(sp["stop"]) for _, sp in server.requests}
    assert stops == {tuple(method.protocol.stop)} and all(
        sp["temperature"] == 0.0 for _, sp in server.requests
    )
    # TIRESRAG-R1 prefills `<think>` and reflects after its answer: verl's own reward cannot read it back
    # from text, the agent loop plays and scores it from its record
    prefill = ["protocol.prefill=<think>"]  # the paper's config prefills; the tiny one does not
    tires = load_method("tiresrag-tiny", prefill)
    loop = make_loop(method="tiresrag-tiny", overrides=prefill)
    out = asyncio.run(loop.run({"temperature": 0.0, "top_p": 1.0, "top_k": -1, "logprobs": 0}, **dataset[0]))
    tires_greedy = dataclasses.replace(tires.rollout, n=1, temperature=0.0)
    (expected,) = tires.make_rollout(backend, retriever, tires_greedy).run([examples[0]], 1)
    assert tires.protocol.prefill and out.prompt_ids == expected.prompt_ids  # the prefill is in the prompt
    assert (out.response_ids, out.response_mask) == (expected.completion_ids, expected.loss_mask)
    (result,) = tires.reward.score([expected], [examples[0]], RewardContext())
    assert out.reward_score == result.total
    with pytest.raises(Exception, match="several samples of one episode"):  # a tree: not one verl row
        make_loop(method="r2ag-tiny")


def test_the_tool_returns_what_ragrl_search_returns(world_dir, tmp_path):  # noqa: ANN001
    pytest.importorskip("verl")
    from ragrl.integrations.verl_agent import RagrlSearchTool

    tool = RagrlSearchTool({"index": str(world_dir / "bm25"), "topk": 3})
    assert tool.name == "search"
    examples = read_examples(world_dir / "test.jsonl")[0][:3]
    protocol = load_method("search_r1").protocol
    for ex in examples:
        out = tmp_path / "hits.jsonl"
        done = CliRunner().invoke(
            app, ["search", str(world_dir / "bm25"), ex.question, "-k", "3", "-o", str(out)]
        )
        assert done.exit_code == 0, done.output
        (record,) = [json.loads(line) for line in out.read_text().splitlines()]
        hits = load_retriever(world_dir / "bm25").search([ex.question], 3)[0]
        assert [h.id for h in hits] == [h["id"] for h in record["hits"]]
        instance, _ = asyncio.run(tool.create())
        response, reward, metrics = asyncio.run(tool.execute(instance, {"query": ex.question}))
        from ragrl.rollout.trajectory import Action

        assert response.text == protocol.observation(Action(kind="search", content=ex.question), hits)
        assert (reward, metrics) == (0.0, {"hits": 3})
        assert all(h.passage.title in response.text for h in hits)
    empty, _, _ = asyncio.run(tool.execute("x", {"query": "  "}))
    assert "non-empty query" in empty.text
