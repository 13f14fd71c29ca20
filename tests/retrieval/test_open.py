"""``open_retriever``: an index folder or a retrieval server's URL, behind the cache or not."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from ragrl.cli import app  # noqa: E402
from ragrl.errors import RagrlError  # noqa: E402
from ragrl.retrieval import BM25Retriever, HttpRetriever  # noqa: E402
from ragrl.retrieval.cache import CachedRetriever  # noqa: E402
from ragrl.retrieval.open import is_url, open_retriever  # noqa: E402
from ragrl.retrieval.server import create_app  # noqa: E402

QUERIES = ["capital of Germany", "highest mountain", "largest river in the world"]


def test_a_folder_loads_the_index_and_a_url_asks_the_server(toy_bm25, tmp_path, serve):
    toy_bm25.save(tmp_path / "bm25")
    local = open_retriever(tmp_path / "bm25")
    assert isinstance(local, BM25Retriever) and local.fingerprint == toy_bm25.fingerprint
    with serve(create_app(toy_bm25)) as url:
        assert is_url(url) and not is_url(str(tmp_path)) and not is_url(tmp_path / "bm25")
        remote = open_retriever(url)
        assert isinstance(remote, HttpRetriever) and remote.fingerprint == toy_bm25.fingerprint
        assert open_retriever(url.replace("http://", "HTTP://")).fingerprint == toy_bm25.fingerprint
        assert remote.search(QUERIES, 3) == toy_bm25.search(QUERIES, 3)
        # ragrl search takes the URL too
        (tmp_path / "q.txt").write_text("\n".join(QUERIES) + "\n")
        searched = CliRunner().invoke(app, ["search", url, "--queries", str(tmp_path / "q.txt"), "-k", "3"])
        assert searched.exit_code == 0, searched.output
        ids = [[hit["id"] for hit in json.loads(line)["hits"]] for line in searched.stdout.splitlines()]
        assert ids == [[h.passage.id for h in row] for row in toy_bm25.search(QUERIES, 3)]


def test_a_cached_server_is_replayed_without_it(toy_bm25, tmp_path, serve):
    cache = tmp_path / "hits.sqlite"
    with serve(create_app(toy_bm25)) as url:
        recorded = open_retriever(url, cache=cache)
        assert isinstance(recorded, CachedRetriever) and isinstance(recorded.inner, HttpRetriever)
        first = recorded.search(QUERIES, 3)
        assert recorded.queries_searched == 3 and recorded.queries_from_cache == 0
        recorded.close()
    replayed = open_retriever(url, cache=cache, cache_mode="replay")  # the server is gone
    assert replayed.search(QUERIES, 3) == first == toy_bm25.search(QUERIES, 3)
    assert replayed.queries_searched == 0 and replayed.fingerprint == toy_bm25.fingerprint
    with pytest.raises(
        RagrlError, match="replay miss: query .a query never searched. with k=3 is not in the cache"
    ):
        replayed.search(["a query never searched"], 3)


def test_a_search_r1_server_works_but_cannot_key_a_cache(toy_bm25, tmp_path, serve, search_r1_app):
    with serve(search_r1_app(toy_bm25)) as url:
        remote = open_retriever(url)  # /health answers 404: the server is checked with one search
        hits = remote.search(QUERIES, 2)
        assert [[h.passage.id for h in row] for row in hits] == [
            [h.passage.id for h in row] for row in toy_bm25.search(QUERIES, 2)
        ]
        with pytest.raises(RagrlError, match="a retrieval cache keys its hits by the index's fingerprint"):
            open_retriever(url, cache=tmp_path / "c.sqlite")
        assert isinstance(open_retriever(url, cache=tmp_path / "c.sqlite", cache_mode="off"), HttpRetriever)


def test_a_url_nobody_answers_is_an_error_at_once(monkeypatch, tmp_path):
    import socket

    monkeypatch.setattr("ragrl.retrieval.http.time.sleep", lambda s: None)  # the retries' back-off
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(RagrlError, match=rf"http://127.0.0.1:{port} does not answer as a retrieval server"):
        open_retriever(f"http://127.0.0.1:{port}")
    with pytest.raises(RagrlError, match="cache mode 'replay' says how to use a retrieval cache"):
        open_retriever(str(tmp_path), cache_mode="replay")  # no cache file: the mode would be ignored
    with pytest.raises(RagrlError, match="unknown cache mode 'sometimes'"):
        open_retriever(str(tmp_path), cache=tmp_path / "c.sqlite", cache_mode="sometimes")
    with pytest.raises(RagrlError, match="index directory does not exist"):
        open_retriever(tmp_path / "nothing")


def test_a_closed_server_client_says_so_and_close_all_closes_the_rest(toy_bm25, serve):
    from ragrl.retrieval.open import close_all

    class Breaks:
        def close(self):
            raise OSError("engine would not stop")

    with serve(create_app(toy_bm25)) as url:
        remote = open_retriever(url)
        with pytest.raises(OSError, match="engine would not stop"):
            close_all(Breaks(), remote, object())  # the retriever is closed though the first failed
        with pytest.raises(RagrlError, match=f"POST {url}/retrieve: the retriever was closed"):
            remote.search(["x"], 1)
