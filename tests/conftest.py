"""Shared test fixtures.

Real dataset samples live in ``../shared/data`` beside the repository (see its SOURCES.md). Tests
that read them use the ``shared_data`` fixture, which skips cleanly when the folder is absent.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

# No per-example deadline (a loaded CI machine must not turn slow examples into failures); in CI
# (CI=true) the examples are derandomized so a run is reproducible.
settings.register_profile("dev", deadline=None)
settings.register_profile("ci", deadline=None, derandomize=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("RAGRL_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))


@pytest.fixture
def one_process_group(tmp_path: Path) -> Iterator[None]:
    """A gloo process group of one (what FSDP2's ``fully_shard`` needs), torn down after the test; an
    existing group is used as it is."""
    import torch.distributed as dist

    started = not dist.is_initialized()
    if started:
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'group'}", rank=0, world_size=1)
    try:
        yield
    finally:
        if started:
            dist.destroy_process_group()


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared dataset samples not found at {SHARED_DATA}")
    return SHARED_DATA


# A small synthetic world with a BM25 index and a tiny policy (hidden 64, 2 layers), shared by the
# eval and train tests.
@pytest.fixture(scope="session")
def world_dir(tmp_path_factory):
    from typer.testing import CliRunner

    from ragrl.cli import app

    d = tmp_path_factory.mktemp("world")
    runner = CliRunner()
    for args in (
        ["data", "synth", "--seed", "3", "--size", "small", "--split", "entities", "--out", str(d)],
        ["index", str(d / "corpus.jsonl"), "--out", str(d / "bm25")],
        ["model", "tiny", "--data", str(d), "--out", str(d / "model"), "--hidden", "64", "--layers", "2"],
    ):
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
    return d


class CountingRetriever:
    """A retriever that passes every search to ``inner`` and records each call's queries in ``calls``."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[list[str]] = []

    @property
    def fingerprint(self) -> Any:
        return self.inner.fingerprint

    def search(self, queries: list[str], k: int) -> Any:
        self.calls.append(list(queries))
        return self.inner.search(queries, k)

    def save(self, directory: Any) -> None:
        self.inner.save(directory)


@pytest.fixture
def counting_retriever() -> type[CountingRetriever]:
    """``counting_retriever(inner)``: ``inner`` wrapped so that each search call's queries are recorded."""
    return CountingRetriever


@contextlib.contextmanager
def serving(app: Any) -> Iterator[str]:
    """``app`` (an ASGI app: ``create_app(retriever)``) served by uvicorn on a free loopback port in a
    thread; yields its base URL and stops it afterwards."""
    import socket

    uvicorn = pytest.importorskip("uvicorn")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 5
        while not server.started:
            assert time.monotonic() < deadline, "uvicorn did not start within 5 s"
            time.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=5)
    assert not thread.is_alive()


@pytest.fixture
def serve() -> Any:
    """``with serve(app) as url:``: an ASGI app on loopback for the test (``serving``)."""
    return serving


def search_r1_like(retriever: Any) -> Any:
    """Search-R1's retrieval_server.py as an app: POST /retrieve only (no /health, so no fingerprint),
    documents as FlashRAG's ``contents``."""
    from fastapi import FastAPI

    app = FastAPI()

    @app.post("/retrieve")
    def retrieve(body: dict) -> dict:
        hits = retriever.search(body["queries"], body.get("topk", 3))
        result = [[{"document": {"id": h.passage.id, "contents": f"{h.passage.title}\n{h.passage.text}"},
                    "score": h.score} for h in row] for row in hits]  # fmt: skip
        return {"result": result}

    return app


@pytest.fixture
def search_r1_app() -> Any:
    """``search_r1_app(retriever)``: Search-R1's server for it, to ``serve``."""
    pytest.importorskip("fastapi")
    return search_r1_like


# An OpenAI-compatible chat server on localhost, for the judge clients and the judged rewards.
@dataclass
class ChatServer:
    """A tiny OpenAI chat-completions server: answers from ``script`` (status, body) first, then
    ``yes`` when the prompt's answer block holds a gold label verbatim, else ``no``."""

    url: str = ""
    script: list[tuple[int, Any]] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    delay: float = 0.0
    """Seconds each request is held before the reply (to see concurrent requests)."""
    in_flight: int = 0
    max_in_flight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def respond(self, body: dict[str, Any]) -> tuple[int, Any]:
        if self.script:
            return self.script.pop(0)
        prompt = body["messages"][-1]["content"]
        gold = prompt.split("\n", 1)[1].split("\n\n\n\n", 1)[0]
        answer = prompt.split("\n\n\n\n")[1].split("\n", 1)[1]
        reply = "Yes" if repr(answer) in gold else "No"
        return 200, {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "model": body["model"],
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": reply}, "finish_reason": "stop"}
            ],
        }


@pytest.fixture
def chat_server() -> Iterator[ChatServer]:
    state = ChatServer()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", 0))
            body = json.loads(self.rfile.read(length))
            state.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
            with state.lock:
                state.in_flight += 1
                state.max_in_flight = max(state.max_in_flight, state.in_flight)
            time.sleep(state.delay)
            with state.lock:
                state.in_flight -= 1
            if self.path != "/v1/chat/completions":
                status, payload = 404, {"error": {"message": f"no route {self.path}"}}
            else:
                status, payload = state.respond(body)
            data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
