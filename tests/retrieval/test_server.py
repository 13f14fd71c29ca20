from __future__ import annotations

import json
import threading

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from fastapi.testclient import TestClient  # noqa: E402

from ragrl.errors import RagrlError  # noqa: E402
from ragrl.retrieval import HttpRetriever  # noqa: E402
from ragrl.retrieval.cache import CachedRetriever  # noqa: E402
from ragrl.retrieval.server import create_app  # noqa: E402

QUERIES = ["capital of Germany", "highest mountain", "the of and", "largest river in the world"]


@pytest.fixture(scope="module")
def client(toy_bm25):
    with TestClient(create_app(toy_bm25, max_batch=8, max_k=10)) as c:
        yield c


def _expected(retriever, queries, k, scores=True):
    out = []
    for row in retriever.search(queries, k):
        items = []
        for h in row:
            doc = {
                "id": h.passage.id,
                "contents": f"{h.passage.title}\n{h.passage.text}",
                "title": h.passage.title,
                "text": h.passage.text,
            }
            items.append({"document": doc, "score": h.score} if scores else doc)
        out.append(items)
    return out


def test_retrieve_matches_local_search(client, toy_bm25):
    r = client.post("/retrieve", json={"queries": QUERIES, "topk": 3, "return_scores": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"result"}
    assert body["result"] == _expected(toy_bm25, QUERIES, 3)
    assert body["result"][0][0]["document"]["title"] == "Berlin"
    assert body["result"][2] == []  # zero-score rule: no term in common


def test_retrieve_defaults_and_query_list_alias(client, toy_bm25):
    r = client.post("/retrieve", json={"query_list": QUERIES[:2]})  # verl's SearchTool spelling
    assert r.status_code == 200, r.text
    assert r.json()["result"] == _expected(toy_bm25, QUERIES[:2], 3)  # topk 3, scores on by default


def test_retrieve_without_scores(client, toy_bm25):
    r = client.post("/retrieve", json={"queries": QUERIES[:2], "topk": 2, "return_scores": False})
    assert r.status_code == 200, r.text
    assert r.json()["result"] == _expected(toy_bm25, QUERIES[:2], 2, scores=False)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "queries: field required"),
        ({"topk": 3}, "queries: field required"),
        ({"queries": []}, "queries: List should have at least 1 item"),
        ({"queries": ["ok", 7]}, "queries.1: Input should be a valid string"),
        ({"query_list": [None]}, "query_list.0: Input should be a valid string"),
        ({"queries": "not a list"}, "queries: Input should be a valid list"),
        ({"queries": ["a"], "topk": 0}, "topk: Input should be greater than or equal to 1"),
        ({"queries": ["a"], "topk": 11}, "topk: Input should be less than or equal to 10"),
        ({"queries": ["a"], "topk": "3"}, "topk: Input should be a valid integer"),
        ({"queries": ["a"] * 9}, "queries: List should have at most 8 items"),
        ({"queries": ["a"], "return_scores": "yes"}, "return_scores: Input should be a valid boolean"),
    ],
)
def test_retrieve_validation_errors(client, body, message):
    r = client.post("/retrieve", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["error"].startswith(message), r.json()
    assert r.json()["detail"]


def test_retrieve_invalid_json(client):
    r = client.post("/retrieve", content=b'{"queries": ["a"', headers={"content-type": "application/json"})
    assert r.status_code == 422
    assert r.json()["error"].startswith("body: invalid JSON at character 16")
    r = client.post("/retrieve", json=["a", "b"])
    assert r.status_code == 422
    assert r.json()["error"].startswith("body: ")


def test_health(client, toy_bm25, toy_passages):
    r = client.get("/health")
    assert r.status_code == 200
    assert r.json() == {
        "status": "ok",
        "retriever": "bm25",
        "fingerprint": toy_bm25.fingerprint,
        "passages": len(toy_passages),
    }


def test_create_app_rejects_bad_limits(toy_bm25):
    with pytest.raises(RagrlError, match="must be positive, got max_k=0"):
        create_app(toy_bm25, max_k=0)
    with pytest.raises(RagrlError, match="max_request_bytes=0, batch_queries=-1"):
        create_app(toy_bm25, max_request_bytes=0, batch_queries=-1)


def test_a_body_over_the_limit_is_413_and_the_server_keeps_serving(toy_bm25):
    with TestClient(create_app(toy_bm25, max_request_bytes=1000)) as c:
        big = {"queries": ["capital of Germany " * 10] * 10}  # about 2 KB
        r = c.post("/retrieve", json=big)
        assert r.status_code == 413
        assert "over the server's limit of 1,000 bytes" in r.json()["error"]

        def chunks():  # no content-length: the limit counts the bytes as they arrive
            yield b'{"queries": ["'
            for _ in range(50):
                yield b"x" * 100
            yield b'"]}'

        r = c.post("/retrieve", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413
        ok = c.post("/retrieve", json={"queries": QUERIES[:1]})
        assert ok.status_code == 200 and ok.json()["result"] == _expected(toy_bm25, QUERIES[:1], 3)


def test_a_query_over_the_length_limit_is_422(toy_bm25):
    with TestClient(create_app(toy_bm25, max_query_chars=20)) as c:
        r = c.post("/retrieve", json={"queries": ["short", "y" * 21]})
        assert r.status_code == 422
        assert r.json()["error"] == "queries.1: String should have at most 20 characters"


# -- HttpRetriever ---------------------------------------------------------------------------------


def test_http_retriever_matches_local(client, toy_bm25):
    remote = HttpRetriever("http://testserver/retrieve", client=client, batch_size=3)  # 2 batches
    assert remote.url == "http://testserver"
    assert remote.fingerprint == toy_bm25.fingerprint
    for k in (1, 3, 10):
        got, want = remote.search(QUERIES, k), toy_bm25.search(QUERIES, k)
        assert got == want  # same passages (id, title, text) and bit-identical scores
    assert remote.search([], 3) == []
    with pytest.raises(RagrlError, match="k must be a positive integer"):
        remote.search(["a"], 0)


def test_http_retriever_under_cache(client, toy_bm25, tmp_path):
    remote = HttpRetriever("http://testserver", client=client)
    with CachedRetriever(toy_bm25, tmp_path / "c.db", "record") as local_cache:
        local_cache.search(QUERIES, 3)
    # the same fingerprint over HTTP: hits recorded locally replay through the remote retriever
    with CachedRetriever(remote, tmp_path / "c.db", "replay") as cache:
        assert cache.fingerprint == toy_bm25.fingerprint
        assert cache.search(QUERIES, 3) == toy_bm25.search(QUERIES, 3)


def test_http_retriever_server_errors_are_clear(client):
    remote = HttpRetriever("http://testserver", client=client, retries=0)
    with pytest.raises(RagrlError, match="got 'ftp://x'"):
        HttpRetriever("ftp://x")
    with pytest.raises(RagrlError) as e:
        remote.search(["a"], 11)  # above the server's max_k: a 4xx, not retried
    assert "POST http://testserver/retrieve failed with HTTP 422" in str(e.value)
    assert "topk: Input should be less than or equal to 10" in str(e.value)
    with pytest.raises(RagrlError, match="no index to save"):
        remote.save("anywhere")


def _search_r1_document(passage, with_id=True):
    doc = {"contents": f'"{passage.title}"\n{passage.text}'}  # FlashRAG quotes titles
    if with_id:
        doc["id"] = passage.id
    return doc


def test_http_retriever_reads_search_r1_documents(toy_passages):
    """Search-R1's dense server sends {id, contents}; its BM25 server sends {title, text, contents}."""
    p, q = toy_passages[0], toy_passages[3]

    def handler(request):
        return httpx.Response(
            200,
            json={
                "result": [
                    [
                        {"document": _search_r1_document(p), "score": 0.9},
                        {"document": _search_r1_document(q, with_id=False), "score": 0.5},
                        {"document": {"title": q.title, "text": q.text, "contents": "x"}, "score": 0.1},
                    ]
                ]
            },
        )

    remote = HttpRetriever("http://search-r1", client=httpx.Client(transport=httpx.MockTransport(handler)))
    hits = remote.search(["q"], 3)[0]
    assert [h.passage for h in hits] == [p, q, q]  # content-derived id when the server sends none
    assert [h.score for h in hits] == [0.9, 0.5, 0.1]
    assert len(remote.search(["q"], 2)[0]) == 2  # never more than k
    with pytest.raises(RagrlError, match="pass HttpRetriever\\(..., fingerprint=...\\)"):
        remote.fingerprint  # noqa: B018  (no /health here: the mock answers it without a fingerprint)
    assert HttpRetriever("http://x", fingerprint="f" * 32, client=remote._client).fingerprint == "f" * 32


def test_http_retriever_retries_then_succeeds(client, toy_bm25, monkeypatch):
    delays = []
    monkeypatch.setattr("ragrl.retrieval.http.time.sleep", delays.append)
    calls = []

    def handler(request):
        calls.append(request)
        if len(calls) <= 2:
            return httpx.Response(503, text="warming up")
        response = client.post(request.url.path, content=request.content, headers=request.headers)
        return httpx.Response(response.status_code, content=response.content, headers=response.headers)

    remote = HttpRetriever(
        "http://retriever",
        retries=3,
        backoff=0.25,
        client=httpx.Client(transport=httpx.MockTransport(handler)),
    )
    assert remote.search(QUERIES, 3) == toy_bm25.search(QUERIES, 3)
    assert len(calls) == 3
    assert delays == [0.25, 0.5]


def test_http_retriever_connection_errors_are_retried(toy_bm25, monkeypatch):
    monkeypatch.setattr("ragrl.retrieval.http.time.sleep", lambda s: None)
    calls = []

    def handler(request):
        calls.append(request)
        if len(calls) == 1:
            raise httpx.ConnectError("connection refused", request=request)
        return httpx.Response(200, json={"result": [[]]})

    remote = HttpRetriever("http://retriever", client=httpx.Client(transport=httpx.MockTransport(handler)))
    assert remote.search(["a"], 3) == [[]]
    assert len(calls) == 2


def test_http_retriever_gives_up_with_a_clear_error(monkeypatch):
    monkeypatch.setattr("ragrl.retrieval.http.time.sleep", lambda s: None)
    calls = []

    def handler(request):
        calls.append(request)
        return httpx.Response(500, text="Internal Server Error: index not loaded")

    remote = HttpRetriever(
        "http://retriever:9/", retries=2, client=httpx.Client(transport=httpx.MockTransport(handler))
    )
    with pytest.raises(RagrlError) as e:
        remote.search(["a"], 3)
    assert str(e.value) == (
        "POST http://retriever:9/retrieve failed after 3 attempts: "
        "HTTP 500: Internal Server Error: index not loaded"
    )
    assert len(calls) == 3


def test_http_retriever_rejects_malformed_answers():
    answers = iter([{"result": []}, {"result": [[{"document": {"id": "1", "contents": "t\nx"}}]]}, "nope"])

    def handler(request):
        answer = next(answers)
        if isinstance(answer, str):
            return httpx.Response(200, text=answer)
        return httpx.Response(200, json=answer)

    remote = HttpRetriever("http://r", client=httpx.Client(transport=httpx.MockTransport(handler)))
    with pytest.raises(RagrlError, match="one list per query \\(1\\), got 0 lists"):
        remote.search(["a"], 3)
    with pytest.raises(RagrlError, match="query 'a': result 0 has no numeric 'score'"):
        remote.search(["a"], 3)
    with pytest.raises(RagrlError, match="the response is not JSON"):
        remote.search(["a"], 3)


def test_real_server_over_loopback(toy_bm25, serve):
    with serve(create_app(toy_bm25)) as url, HttpRetriever(url, timeout=5) as remote:
        assert remote.fingerprint == toy_bm25.fingerprint
        assert remote.search(QUERIES, 3) == toy_bm25.search(QUERIES, 3)
        # concurrent clients: the server serialises retriever calls, answers stay per-request
        results: dict[int, object] = {}

        def worker(i):
            results[i] = remote.search([QUERIES[i % len(QUERIES)]], 2)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for i in range(8):
            assert results[i] == toy_bm25.search([QUERIES[i % len(QUERIES)]], 2)


def test_server_needs_fastapi(monkeypatch, toy_bm25):
    import builtins

    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == "fastapi" or name.startswith("fastapi."):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(RagrlError, match=r"pip install 'ragrl\[server\]'"):
        create_app(toy_bm25)


def _assert_logging(started: dict, access_log: bool) -> None:
    """What uvicorn's loggers let through once it configures them with the arguments ``ragrl serve``
    passed: its request lines (INFO) only when asked, its start-up lines (INFO) never, warnings always.
    In a process of its own: uvicorn's logging set-up closes every handler of the process (pytest's too)."""
    import subprocess
    import sys

    kwargs = {k: v for k, v in started.items() if k not in ("app", "host", "port")}
    check = (
        "import json, logging, sys, uvicorn\n"
        "uvicorn.Config('unused:app', **json.loads(sys.argv[1]))  # configures the loggers as run() does\n"
        "print(json.dumps([logging.getLogger(n).isEnabledFor(l) for n, l in (('uvicorn.access', 20),"
        " ('uvicorn.error', 20), ('uvicorn.error', 30))]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", check, json.dumps(kwargs)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [access_log, False, True]


def test_serve_command(tmp_path, toy_bm25, monkeypatch):
    uvicorn = pytest.importorskip("uvicorn")
    from typer.testing import CliRunner

    from ragrl.cli import app

    toy_bm25.save(tmp_path / "idx")
    started = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: started.update(app=app, **kw))
    result = CliRunner().invoke(app, ["serve", str(tmp_path / "idx"), "--port", "8123", "--max-k", "5"])
    assert result.exit_code == 0, result.output
    assert started["host"] == "127.0.0.1" and started["port"] == 8123
    assert started["access_log"] is False
    _assert_logging(started, access_log=False)  # quiet: uvicorn's warnings and errors only
    assert "at http://127.0.0.1:8123" in result.stderr
    assert "curl -s http://127.0.0.1:8123/retrieve" in result.stderr
    with TestClient(started["app"]) as c:
        assert c.get("/health").json()["fingerprint"] == toy_bm25.fingerprint
        assert c.post("/retrieve", json={"queries": ["a"], "topk": 6}).status_code == 422  # --max-k 5

    result = CliRunner().invoke(app, ["serve", str(tmp_path / "idx"), "--access-log"])
    assert result.exit_code == 0 and started["access_log"] is True
    _assert_logging(started, access_log=True)  # a line a request, still no start-up lines

    result = CliRunner().invoke(app, ["serve", str(tmp_path / "missing")])
    assert result.exit_code != 0
    assert "index directory does not exist" in str(result.exception)
