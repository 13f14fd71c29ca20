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
    sampling_params) -> TokenOutput``), played by ragrl's transformers backend. ``logprobs`` False:
    replies without log-probs (verl's ``calculate_log_probs`` off)."""

    def __init__(self, backend: TransformersBackend, logprobs: bool = True) -> None:
        self.backend, self.logprobs = backend, logprobs
        self.requests: list[tuple[str, dict]] = []

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict, **_: object):  # noqa: ANN201
        from verl.workers.rollout.replica import TokenOutput

        self.requests.append((request_id, dict(sampling_params)))
        params = SamplingParams(
            max_new_tokens=sampling_params["max_tokens"],
            temperature=sampling_params["temperature"],
            stop=tuple(sampling_params["stop"]),
        )
        await asyncio.sleep(0)  # other episodes' requests interleave, as on a real server
        (g,) = self.backend.generate([prompt_ids], params)
        return TokenOutput(
            token_ids=g.token_ids,
            log_probs=g.logprobs if self.logprobs else None,
            stop_reason="completed",
            extra_fields={"min_global_steps": 3, "max_global_steps": 3},
        )


GREEDY = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "logprobs": 0}


@pytest.fixture(scope="module")
def setup(world_dir):  # noqa: ANN001, ANN201
    pytest.importorskip("verl")
    backend = TransformersBackend(str(SHIPPED_BASE), device="cpu")
    examples = read_examples(world_dir / "test.jsonl")[0][:4]
    return backend, examples


def _verl_config(tmp_path: Path, *overrides: str):  # noqa: ANN202
    import verl
    from hydra import compose, initialize_config_dir

    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(
            config_name="ppo_trainer",
            overrides=[
                "actor_rollout_ref.rollout.response_length=1024",
                "actor_rollout_ref.rollout.skip_tokenizer_init=False",
                f"actor_rollout_ref.model.path={SHIPPED_BASE}",
                f"+data.cache_dir={tmp_path}",
                *overrides,
            ],
        )


def _maker(config, server, tokenizer, index):  # noqa: ANN001, ANN202
    """``make(**entry)``: an agent loop built as verl's AgentLoopWorker builds one for every row."""
    import hydra
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    def make(**entry: object):  # noqa: ANN202
        return hydra.utils.instantiate(
            config={"_target_": "ragrl.integrations.verl_agent.RagrlAgentLoop", "method": "search_r1-tiny",
                    "index": index, **entry},
            trainer_config=DictConfigWrap(config=config), server_manager=server, tokenizer=tokenizer,
            processor=None, dataset_cls=RLHFDataset, data_config=DictConfigWrap(config.data),
            tools=ToolListWrap([]),
        )  # fmt: skip

    return make


def test_the_agent_loop_plays_ragrls_rollout(setup, world_dir, tmp_path):  # noqa: ANN001
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from ragrl.integrations import verl as rv

    backend, examples = setup
    config = _verl_config(tmp_path)
    path = tmp_path / "rows.parquet"
    rv.write_parquet(examples, path, agent_name="ragrl_agent")
    dataset = RLHFDataset([str(path)], backend.tokenizer, config.data)
    rows = [dataset[i] for i in range(len(examples))]
    assert {r["agent_name"] for r in rows} == {"ragrl_agent"}
    server = TransformersServer(backend)
    make = _maker(config, server, backend.tokenizer, str(world_dir / "bm25"))

    async def play_all():  # noqa: ANN202  (the episodes at once on one event loop, as in verl's worker)
        return await asyncio.gather(*(make().run(GREEDY, **row) for row in rows))

    outputs = asyncio.run(play_all())
    method = load_method("search_r1-tiny")
    greedy = dataclasses.replace(method.rollout, n=1, temperature=0.0)
    retriever = load_retriever(world_dir / "bm25")
    searched = 0
    for out, ex in zip(outputs, examples, strict=True):
        (expected,) = method.make_rollout(backend, retriever, greedy).run([ex], 1)
        assert out.prompt_ids == expected.prompt_ids
        assert out.response_ids == expected.completion_ids
        assert out.response_mask == expected.loss_mask  # ragrl's loss mask: 0 on every observation token
        assert out.response_logprobs == pytest.approx(expected.completion_logprobs, abs=1e-5)
        (result,) = method.reward.score([expected], [ex], RewardContext())
        assert out.reward_score == result.total and out.extra_fields["ragrl_em"] == result.components["em"]
        assert out.extra_fields["ragrl_finish_reason"] == expected.finish_reason
        assert out.extra_fields["min_global_steps"] == out.extra_fields["max_global_steps"] == 3
        assert out.extra_fields["ragrl_aborted"] is False
        searched += out.extra_fields["ragrl_searches"]
        if out.extra_fields["ragrl_searches"]:
            assert 0 in out.response_mask
    assert searched > 0  # the episodes did search: the mask has observation tokens to get right
    assert len({rid for rid, _ in server.requests}) == len(examples)  # one request id an episode
    assert {tuple(sp["stop"]) for _, sp in server.requests} == {tuple(method.protocol.stop)}
    assert all(sp["temperature"] == 0.0 for _, sp in server.requests)  # verl's sampling settings
    # replies without log-probs give none to verl (not zeros it would take for p = 1)
    quiet = _maker(
        config, TransformersServer(backend, logprobs=False), backend.tokenizer, str(world_dir / "bm25")
    )
    out = asyncio.run(quiet().run(GREEDY, **rows[0]))
    assert out.response_logprobs is None and out.response_ids == outputs[0].response_ids
    # TIRESRAG-R1 prefills `<think>` and reflects after its answer: verl's own reward cannot read it back
    # from text, the agent loop plays and scores it from its record
    prefill = ["protocol.prefill=<think>"]  # the paper's config prefills; the tiny one does not
    tires = load_method("tiresrag-tiny", prefill)
    out = asyncio.run(make(method="tiresrag-tiny", overrides=prefill).run(GREEDY, **rows[0]))
    tires_greedy = dataclasses.replace(tires.rollout, n=1, temperature=0.0)
    (expected,) = tires.make_rollout(backend, retriever, tires_greedy).run([examples[0]], 1)
    assert tires.protocol.prefill and out.prompt_ids == expected.prompt_ids  # the prefill is in the prompt
    assert (out.response_ids, out.response_mask) == (expected.completion_ids, expected.loss_mask)
    (result,) = tires.reward.score([expected], [examples[0]], RewardContext())
    assert out.reward_score == result.total


def test_the_agent_loop_refuses_what_verl_would_cut_or_cannot_hold(setup, world_dir, tmp_path):  # noqa: ANN001
    backend, examples = setup
    index = str(world_dir / "bm25")
    server = TransformersServer(backend)
    make = _maker(_verl_config(tmp_path), server, backend.tokenizer, index)
    with pytest.raises(Exception, match="several samples of one episode"):  # a tree: not one verl row
        make(method="r2ag-tiny")
    short = _maker(_verl_config(tmp_path, "actor_rollout_ref.rollout.response_length=256"), server,
                   backend.tokenizer, index)  # fmt: skip
    with pytest.raises(Exception, match=r"max_total_tokens \(320\) is more than .*response_length \(256\)"):
        short()
    blind = _maker(_verl_config(tmp_path, "actor_rollout_ref.rollout.skip_tokenizer_init=True"), server,
                   backend.tokenizer, index)  # fmt: skip
    with pytest.raises(Exception, match="skip_tokenizer_init=False"):
        blind()
    from ragrl.integrations import verl as rv

    (row,) = rv.verl_rows(examples[:1])
    tight = _maker(_verl_config(tmp_path, "actor_rollout_ref.rollout.prompt_length=16"), server,
                   backend.tokenizer, index)  # fmt: skip
    with pytest.raises(Exception, match=r"prompt is \d+ tokens, more than .*prompt_length \(16\)"):
        asyncio.run(tight().run(GREEDY, **row))


def test_what_a_servers_tokens_are_to_ragrl(setup):  # noqa: ANN001
    from ragrl.integrations.verl_agent import ServerBackend

    backend, _ = setup
    tok = backend.tokenizer
    server = ServerBackend(None, tok, {}, None, "r", eos_ids=frozenset({tok.eos_token_id, 7}))
    params = SamplingParams(max_new_tokens=64, stop=("</search>", "</answer>"), stop_token_ids=(9,))
    ids = tok.encode("<search> a query </search>\n", add_special_tokens=False)
    g = server.generation(ids, None, params)  # the token that completed the stop carried more text
    assert (g.finish_reason, g.stop, g.logprobs) == ("stop", "</search>", [0.0] * len(ids))
    assert server.generation([5, 6, 7], [0.1, 0.2, 0.3], params).finish_reason == "eos"  # the model's EOS
    assert server.generation([5, 9], None, params).stop == 9  # a stop token
    assert server.generation([5, 6], None, params).finish_reason == "length"


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


def test_an_aborted_reply_and_unsynced_steps(setup):  # noqa: ANN001
    from ragrl.integrations.verl_agent import ServerBackend

    backend, _ = setup

    class Aborting(TransformersServer):
        async def generate(self, request_id: str, **kw: object):  # noqa: ANN202
            out = await super().generate(request_id, **kw)
            fields = {"min_global_steps": None, "max_global_steps": None}  # no weights synced yet
            return out.model_copy(
                update={"stop_reason": "aborted", "log_probs": None, "extra_fields": fields}
            )

    server = ServerBackend(Aborting(backend), backend.tokenizer, GREEDY, None, "r")
    prompt = backend.tokenizer.encode("Question: who?", add_special_tokens=False)
    g = asyncio.run(server._one(prompt, SamplingParams(max_new_tokens=8, stop=("</search>",))))
    assert g.finish_reason == "length" and server.aborted  # the turn ends as cut
    assert server.with_logprobs  # an aborted reply never has log-probs: the episode's others still count
    assert "min_global_steps" not in server.extra_fields
    server._keep({"min_global_steps": 2, "max_global_steps": 2, "num_cached_tokens": 7})
    server._keep({"min_global_steps": 5, "max_global_steps": 5})
    assert server.extra_fields == {"min_global_steps": 2, "max_global_steps": 5}
