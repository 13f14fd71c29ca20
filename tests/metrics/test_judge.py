"""LLM-as-a-judge: ARENA's prompt, reply parsing, the OpenAI-compatible client against a real local
HTTP server, and the local judge on a tiny model."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from ragrl.errors import DataError, RagrlError
from ragrl.metrics import (
    JUDGE_SYSTEM,
    JUDGE_TEMPLATE,
    CachedJudge,
    JudgeClient,
    LocalJudge,
    OpenAIJudge,
    judge_answer,
    judge_answers,
    judge_messages,
    judge_prompt,
    make_judge,
    parse_judgement,
)

GOLDEN_PROMPT = (
    "*************This is a knowledge question-answering task with retrieved passages (RAG), used to "
    "evaluate a model. The list of correct answers is:*************\n"
    "['Paris', 'City of Light']"
    "\n\n\n\n"
    "*************The model's answer is:*************\n"
    "paris, france"
    "\n\n\n\n"
    "*************Is the model's answer correct? It counts as correct if it matches any item in the "
    'correct answer list, or a synonym of one. Reply with only "yes" or "no".*************'
)


# -- prompt ----------------------------------------------------------------------------------------


def test_prompt_golden_string():
    assert judge_prompt(["Paris", "City of Light"], "paris, france") == GOLDEN_PROMPT
    assert JUDGE_SYSTEM == "You are an intelligent AI assistant."
    banners = [block.split("\n")[0] for block in GOLDEN_PROMPT.split("\n\n\n\n")]
    assert len(banners) == 3
    for banner in banners:  # 13 asterisks each side, no more
        assert banner.startswith("*" * 13) and banner.endswith("*" * 13)
        assert banner[13] != "*" and banner[-14] != "*"


def test_prompt_labels_are_str_of_the_list():
    # {correct_answer} is str(list_of_labels): Python's repr quoting, a single string becomes a list
    assert '\n["it\'s"]\n' in judge_prompt(["it's"], "x")
    assert "\n['1987']\n" in judge_prompt("1987", "x")
    assert judge_prompt(("a", "b"), "x") == judge_prompt(["a", "b"], "x")
    with pytest.raises(RagrlError, match="no gold answers"):
        judge_prompt([], "x")


def test_prompt_custom_template_single_pass():
    template = "Q: {question}\nGold: {correct_answer}\nPred: {model_response}\n{literal}"
    out = judge_prompt(["A"], "uses {question} text", template, question="Who {correct_answer}?")
    # inserted text is never substituted again; unknown braces stay literal
    assert out == "Q: Who {correct_answer}?\nGold: ['A']\nPred: uses {question} text\n{literal}"
    assert JUDGE_TEMPLATE.count("{") == 2  # the default does not use {question}
    with pytest.raises(RagrlError, match=r"missing placeholder \{model_response\}"):
        judge_prompt(["A"], "x", "{correct_answer} only")


def test_messages():
    assert judge_messages(["Paris", "City of Light"], "paris, france") == [
        {"role": "system", "content": JUDGE_SYSTEM},
        {"role": "user", "content": GOLDEN_PROMPT},
    ]


# -- parsing ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "loose", "strict"),
    [
        ("yes", 1.0, 1.0),
        ("Yes.", 1.0, 1.0),
        ("YES", 1.0, 1.0),
        ("no", 0.0, 0.0),
        ("No.", 0.0, 0.0),
        ("  NO\n", 0.0, 0.0),
        ("", 0.5, 0.5),
        ("maybe", 0.5, 0.5),
        ("Correct.", 0.5, 0.5),
        # the substring quirk ARENA's rule has: 'no' inside other words
        ("I don't know", 0.0, 0.5),
        ("Not sure", 0.0, 0.5),
        ("cannot tell", 0.0, 0.5),
        ("The eyes have it", 1.0, 0.5),
        # 'yes' is tested first, wherever it is
        ("yes and no", 1.0, 1.0),
        ("No, the answer is not yes.", 1.0, 1.0),
        ("no... well, yesterday", 1.0, 0.0),
    ],
)
def test_parse_judgement(reply, loose, strict):
    assert parse_judgement(reply) == loose
    assert parse_judgement(reply, strict=True) == strict


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("No, the answer is not yes.", 0.0),  # starts with no: decided before the 'yes' test
        ("  Yes, but no", 1.0),
        ("Nope", 0.0),  # startswith('no')
        ("The answer: no", 0.0),  # falls through to containment
        ("The answer: yes, not no", 1.0),
        ("unclear", 0.5),
    ],
)
def test_parse_judgement_prefix_first_reward_variant(reply, expected):
    assert parse_judgement(reply, prefix_first=True) == expected


# -- scoring with a scripted client ----------------------------------------------------------------


class ScriptedJudge:
    def __init__(self, reply: str | Callable[[str], str] = "yes") -> None:
        self.reply = reply
        self.calls: list[list[dict[str, str]]] = []

    def complete(self, messages: list[dict[str, str]]) -> str:
        self.calls.append(messages)
        return self.reply(messages[-1]["content"]) if callable(self.reply) else self.reply


def test_empty_prediction_scores_zero_without_calling_the_judge():
    judge = ScriptedJudge("yes")
    assert isinstance(judge, JudgeClient)
    assert judge_answer("q?", ["Paris"], "", client=judge) == 0.0
    assert judge_answer("q?", ["Paris"], "  \n", client=judge) == 0.0
    assert judge.calls == []
    assert judge_answer("q?", ["Paris"], "Paris", client=judge) == 1.0
    assert judge.calls == [judge_messages(["Paris"], "Paris")]


def test_judge_answer_cache_and_options():
    judge = ScriptedJudge("I don't know")
    cache: dict[str, str] = {}
    assert judge_answer("q", ["a"], "b", client=judge, cache=cache) == 0.0
    assert judge_answer("q", ["a"], "b", client=judge, cache=cache, strict=True) == 0.5  # re-parsed
    assert len(judge.calls) == 1
    assert cache == {judge_prompt(["a"], "b"): "I don't know"}
    template = "{question} | {correct_answer} | {model_response}"
    judge_answer("Who?", ["a"], "b", client=judge, template=template)
    assert judge.calls[-1][-1]["content"] == "Who? | ['a'] | b"


def test_judge_answers_batches_dedups_and_uses_the_cache():
    class BatchJudge(ScriptedJudge):
        def __init__(self) -> None:
            super().__init__(lambda prompt: "yes" if "\nParis\n" in prompt else "no")
            self.batches: list[int] = []

        def complete_batch(self, batch):
            self.batches.append(len(batch))
            return [self.complete(m) for m in batch]

    judge = BatchJudge()
    cache = {judge_prompt(["Rome"], "Rome"): "Yes"}
    scores = judge_answers(
        ["q1", "q2", "q3", "q4", "q5"],
        [["Paris"], ["Paris"], ["Rome"], ["Rome"], ["Oslo"]],
        ["Paris", "Paris", "Rome", "", "Bergen"],
        client=judge,
        cache=cache,
    )
    assert scores == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert judge.batches == [2]  # the duplicate, the cached and the empty one are not sent
    assert len(cache) == 3
    plain = ScriptedJudge("no")
    assert judge_answers(["q"], [["a"]], ["b"], client=plain) == [0.0] and len(plain.calls) == 1
    with pytest.raises(RagrlError, match="same length"):
        judge_answers(["q"], [], ["b"], client=plain)


# -- OpenAIJudge against a real HTTP server (tests/conftest.py: chat_server) -----------------------


def test_openai_judge_contract(chat_server, monkeypatch):
    pytest.importorskip("httpx")
    monkeypatch.setenv("RAGRL_TEST_JUDGE_KEY", "sk-test")
    with OpenAIJudge(chat_server.url, "judge-model", api_key_env="RAGRL_TEST_JUDGE_KEY", backoff=0) as judge:
        assert judge.url == chat_server.url + "/v1/chat/completions"
        assert judge_answer("q", ["Paris", "City of Light"], "Paris", client=judge) == 1.0
        assert judge_answer("q", ["Paris"], "Lyon", client=judge) == 0.0
    first = chat_server.requests[0]
    assert first["path"] == "/v1/chat/completions"
    assert first["headers"]["Authorization"] == "Bearer sk-test"
    assert first["body"] == {
        "model": "judge-model",
        "messages": judge_messages(["Paris", "City of Light"], "Paris"),
        "temperature": 0.0,
    }


@pytest.mark.parametrize("suffix", ["", "/", "/v1", "/v1/chat/completions"])
def test_openai_judge_base_url_forms_and_no_key(chat_server, monkeypatch, suffix):
    pytest.importorskip("httpx")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    judge = OpenAIJudge(chat_server.url + suffix, "m", max_tokens=4)
    assert judge.complete([{"role": "user", "content": "x\n['a']\n\n\n\ny\na"}]) == "Yes"
    assert "Authorization" not in chat_server.requests[0]["headers"]
    assert chat_server.requests[0]["body"]["max_tokens"] == 4


def test_openai_judge_retries_500_then_succeeds(chat_server):
    pytest.importorskip("httpx")
    chat_server.script = [(500, "upstream exploded"), (429, {"error": {"message": "slow down"}})]
    judge = OpenAIJudge(chat_server.url, "m", api_key_env=None, backoff=0)
    assert judge_answer("q", ["Paris"], "Paris", client=judge) == 1.0
    assert len(chat_server.requests) == 3
    assert chat_server.requests[0]["body"] == chat_server.requests[2]["body"]


def test_openai_judge_gives_up_after_retries(chat_server):
    pytest.importorskip("httpx")
    chat_server.script = [(503, "overloaded")] * 3
    judge = OpenAIJudge(chat_server.url, "m", api_key_env=None, max_retries=2, backoff=0)
    with pytest.raises(RagrlError) as err:
        judge.complete(judge_messages(["a"], "b"))
    message = str(err.value)
    assert f"POST {chat_server.url}/v1/chat/completions failed after 3 attempts" in message
    assert "HTTP 503: overloaded" in message
    assert len(chat_server.requests) == 3


def test_openai_judge_401_is_not_retried_and_names_url_and_status(chat_server, monkeypatch):
    pytest.importorskip("httpx")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    chat_server.script = [(401, {"error": {"message": "Incorrect API key provided"}})]
    judge = OpenAIJudge(chat_server.url, "m", backoff=0)
    with pytest.raises(RagrlError) as err:
        judge_answer("q", ["Paris"], "Paris", client=judge)
    message = str(err.value)
    assert f"judge POST {chat_server.url}/v1/chat/completions failed with HTTP 401" in message
    assert "Incorrect API key provided" in message
    assert "$OPENAI_API_KEY, which is not set" in message
    assert len(chat_server.requests) == 1


def test_openai_judge_bad_replies(chat_server):
    pytest.importorskip("httpx")
    chat_server.script = [(200, "not json"), (200, {"choices": []}), (200, {"choices": [{"message": {}}]})]
    judge = OpenAIJudge(chat_server.url, "m", api_key_env=None)
    messages = judge_messages(["a"], "b")
    with pytest.raises(RagrlError, match=r"/v1/chat/completions \(HTTP 200\): the response is not JSON"):
        judge.complete(messages)
    with pytest.raises(RagrlError, match=r"expected \{'choices'"):
        judge.complete(messages)
    with pytest.raises(RagrlError, match=r"expected \{'choices'"):
        judge.complete(messages)


def test_openai_judge_connection_refused_names_url():
    pytest.importorskip("httpx")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    judge = OpenAIJudge(f"http://127.0.0.1:{port}", "m", api_key_env=None, max_retries=1, backoff=0)
    with pytest.raises(RagrlError, match=rf"127\.0\.0\.1:{port}/v1/chat/completions failed after 2 attempts"):
        judge.complete(judge_messages(["a"], "b"))


def test_make_judge_and_bad_specs(tmp_path):
    pytest.importorskip("httpx")
    judge = make_judge({"kind": "openai", "base_url": "http://127.0.0.1:1/v1", "model": "m", "timeout": 5})
    assert isinstance(judge, OpenAIJudge) and judge.url == "http://127.0.0.1:1/v1/chat/completions"
    assert judge.timeout == 5
    with pytest.raises(RagrlError, match="unknown kind 'gpt'"):
        make_judge({"kind": "gpt"})
    with pytest.raises(RagrlError, match="unknown key temperatur; allowed: base_url"):
        make_judge({"kind": "openai", "base_url": "http://x", "model": "m", "temperatur": 0})
    with pytest.raises(RagrlError, match=r"kind 'openai'\): missing model"):
        make_judge({"kind": "openai", "base_url": "http://x"})
    with pytest.raises(RagrlError, match="must start with http"):
        make_judge({"kind": "openai", "base_url": "localhost:8000", "model": "m"})
    with pytest.raises(RagrlError, match="not a local model directory"):
        make_judge({"kind": "local", "path": str(tmp_path / "nope")})


# -- LocalJudge on the tiny policy -----------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_judge_dir(tmp_path_factory) -> Path:
    from ragrl.llm.tiny import TinyConfig, create_tiny_policy

    data = tmp_path_factory.mktemp("judge-data")
    (data / "questions.jsonl").write_text(
        json.dumps({"id": "q1", "question": "Where is Zorvex Labs?", "golden_answers": ["Lagos"]}) + "\n",
        encoding="utf-8",
    )
    return create_tiny_policy(
        data,
        tmp_path_factory.mktemp("judge-model") / "tiny",
        seed=5,
        config=TinyConfig(hidden=32, layers=2, heads=2, intermediate=64),
        extra_texts=[JUDGE_SYSTEM, judge_prompt(["Lagos"], "Lagos")],
    )


def test_local_judge_on_tiny_policy(tiny_judge_dir):
    judge = make_judge({"kind": "local", "path": str(tiny_judge_dir), "device": "cpu", "max_new_tokens": 6})
    assert isinstance(judge, LocalJudge) and isinstance(judge, JudgeClient)
    questions = ["Where is Zorvex Labs?"] * 3
    golds = [["Lagos"], ["Lagos"], ["Lagos", "Nigeria"]]
    predictions = ["Lagos", "Accra", "in Lagos"]
    scores = [
        judge_answer(q, g, p, client=judge) for q, g, p in zip(questions, golds, predictions, strict=True)
    ]
    assert all(s in (0.0, 0.5, 1.0) for s in scores)
    # greedy: the same replies again, and the same in one batch as one by one
    assert judge_answers(questions, golds, predictions, client=judge) == scores
    batch = [judge_messages(g, p) for g, p in zip(golds, predictions, strict=True)]
    replies = judge.complete_batch(batch)
    assert replies == [judge.complete(m) for m in batch]
    assert all(isinstance(r, str) for r in replies)
    assert judge_answer("q", ["Lagos"], "", client=judge) == 0.0


def _messages(answer: str) -> list[dict[str, str]]:
    return judge_messages(["Paris"], answer)


def test_openai_judge_batches_run_concurrently_and_keep_their_order(chat_server):
    pytest.importorskip("httpx")
    chat_server.delay = 0.2
    answers = ["Paris", "Lyon", "Paris", "Nice", "Paris", "Rome", "Oslo", "Paris"]
    with OpenAIJudge(chat_server.url, "m", api_key_env=None, backoff=0, concurrency=4) as judge:
        replies = judge.complete_batch([_messages(a) for a in answers])
    assert replies == ["Yes" if a == "Paris" else "No" for a in answers]
    assert chat_server.max_in_flight == 4  # four requests held at once, never more than the bound
    with pytest.raises(RagrlError, match="concurrency must be >= 1"):
        OpenAIJudge(chat_server.url, "m", concurrency=0)


class CountingJudge:
    """A judge that counts the requests it receives (batched ones included)."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def complete(self, messages):  # noqa: ANN001, ANN201
        self.seen.append(messages[-1]["content"])
        return "yes" if "Paris" in messages[-1]["content"].split("The model's answer is:")[-1] else "no"

    def __repr__(self) -> str:
        return "CountingJudge()"


def test_cached_judge_sends_each_request_once_and_persists_replies(tmp_path):
    path = tmp_path / "judge-cache.jsonl"
    client = CountingJudge()
    judge = CachedJudge(client, path)
    batch = [_messages("Paris"), _messages("Lyon"), _messages("Paris")]
    assert judge.complete_batch(batch) == ["yes", "no", "yes"]
    assert len(client.seen) == 2 and (judge.hits, judge.misses) == (1, 2)  # the repeat inside the batch
    assert judge.complete(_messages("Lyon")) == "no" and len(client.seen) == 2
    # a new process reads the file back: nothing is sent again
    again = CachedJudge(CountingJudge(), path)
    assert again.complete_batch(batch) == ["yes", "no", "yes"] and again.client.seen == []

    # the key names the client: another model does not get these replies
    class Other(CountingJudge):
        def __repr__(self) -> str:
            return "Other()"

    other = CachedJudge(Other(), path)
    other.complete(_messages("Paris"))
    assert len(other.client.seen) == 1
    # judge_answers goes through the cache's batch call
    assert judge_answers(["q", "q"], [["Paris"], ["Paris"]], ["Paris", "Lyon"], client=judge) == [1.0, 0.0]
    good = path.read_text()
    path.write_text(good + '{"key": "abc", "rep', encoding="utf-8")  # a crash in the middle of a write
    torn = CachedJudge(CountingJudge(), path)
    assert torn.complete(_messages("Paris")) == "yes" and torn.client.seen == []
    assert path.read_text() == good  # the torn record is cut off; later appends start on their own line
    path.write_text(good + "not json\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"judge-cache.jsonl:4: not a judge cache record"):
        CachedJudge(CountingJudge(), path)


def test_an_empty_reply_is_not_cached(tmp_path):
    class Silent(CountingJudge):  # a reasoning model cut off before any text: content null -> ""
        def complete(self, messages):  # noqa: ANN001, ANN201
            super().complete(messages)
            return ""

    path = tmp_path / "cache.jsonl"
    judge = CachedJudge(Silent(), path)
    assert judge.complete_batch([_messages("Paris"), _messages("Paris")]) == ["", ""]
    assert judge.complete(_messages("Paris")) == "" and len(judge.client.seen) == 2  # asked again
    assert not path.exists() or path.read_text() == ""


def test_make_judge_with_a_cache_and_concurrency(chat_server, tmp_path):
    pytest.importorskip("httpx")
    spec = {"kind": "openai", "base_url": chat_server.url, "model": "m", "api_key_env": None,
            "concurrency": 2, "cache": str(tmp_path / "c.jsonl")}  # fmt: skip
    judge = make_judge(spec)
    assert isinstance(judge, CachedJudge) and judge.client.concurrency == 2
    assert judge.complete_batch([_messages("Paris"), _messages("Paris")]) == ["Yes", "Yes"]
    assert len(chat_server.requests) == 1
    with pytest.raises(RagrlError, match="unknown key concurrency"):
        make_judge({"kind": "local", "path": str(tmp_path), "concurrency": 2})
