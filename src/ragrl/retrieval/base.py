"""The retriever protocol, the ``Hit`` record and the on-disk index manifest.

Every index directory written by ragrl holds a ``retriever.json`` manifest::

    {"type": "bm25", "params": {...}, "corpus_hash": "...", "fingerprint": "...",
     "ragrl_version": "0.1.0", "num_passages": 6119}

``load_retriever(dir)`` reads it and hands the directory to the right class. The ``fingerprint`` is a
stable hash of the retriever type, its result-affecting parameters and the corpus content; the cache
(``ragrl.retrieval.cache``) keys stored hits by it.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ragrl.data.io import json_error, read_text
from ragrl.data.schema import Passage
from ragrl.errors import RagrlError
from ragrl.registry import Registry
from ragrl.retrieval.store import PassageStore

MANIFEST_NAME = "retriever.json"


@dataclass(frozen=True, slots=True)
class Hit:
    """One retrieved passage and its score (higher is better; scales differ between retrievers)."""

    passage: Passage
    score: float

    @property
    def id(self) -> str:
        return self.passage.id

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.passage.id,
            "title": self.passage.title,
            "text": self.passage.text,
            "score": self.score,
        }


@runtime_checkable
class Retriever(Protocol):
    """What every retriever offers.

    ``search`` takes a batch of queries and returns, for each, at most ``k`` hits sorted by descending
    score. ``fingerprint`` identifies the retriever's results (type + parameters + corpus), not the
    object. ``save`` writes a directory that ``load_retriever`` reads back.
    """

    @property
    def fingerprint(self) -> str: ...

    def search(self, queries: list[str], k: int) -> list[list[Hit]]: ...

    def save(self, directory: str | Path) -> None: ...


def corpus_hash(passages: Sequence[Passage]) -> str:
    """A content hash of a corpus that does not depend on passage order (sha256, hex). Only the ids are
    held to sort them: a corpus on disk (``PassageStore``) is read twice, never held whole."""
    ids = [p.id for p in passages]
    h = hashlib.sha256()
    for i in sorted(range(len(ids)), key=ids.__getitem__):
        p = passages[i]
        h.update(f"{p.id}\t{p.title}\t{p.text}\n".encode())
    return h.hexdigest()


def make_fingerprint(kind: str, params: dict[str, Any], corpus: str) -> str:
    """A stable hash of (type, params, corpus hash); params must be JSON-serialisable."""
    blob = json.dumps({"type": kind, "params": params, "corpus": corpus}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def check_k(k: int) -> int:
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise RagrlError(f"k must be a positive integer, got {k!r}")
    return k


def write_manifest(
    directory: str | Path, kind: str, params: dict[str, Any], corpus: str, fingerprint: str, **extra: Any
) -> None:
    from ragrl import __version__

    manifest = {
        "type": kind,
        "params": params,
        "corpus_hash": corpus,
        "fingerprint": fingerprint,
        "ragrl_version": __version__,
        **extra,
    }
    path = Path(directory) / MANIFEST_NAME
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def read_manifest(directory: str | Path) -> dict[str, Any]:
    """Read and validate ``retriever.json``; every failure names the directory and what is missing."""
    d = Path(directory)
    if not d.exists():
        raise RagrlError(f"{d}: index directory does not exist (build one with `ragrl index`)")
    if not d.is_dir():
        raise RagrlError(f"{d}: is a file, expected an index directory (built with `ragrl index`)")
    path = d / MANIFEST_NAME
    if not path.is_file():
        raise RagrlError(f"{d}: not a ragrl index: {MANIFEST_NAME} is missing (build one with `ragrl index`)")
    try:
        manifest = json.loads(read_text(path))
    except json.JSONDecodeError as e:
        raise RagrlError(f"{path}:{e.lineno}: {json_error(e)}") from None
    if not isinstance(manifest, dict):
        raise RagrlError(f"{path}: expected a JSON object")
    for key in ("type", "params", "corpus_hash"):
        if key not in manifest:
            raise RagrlError(f"{path}: field '{key}' is missing")
    if not isinstance(manifest["params"], dict):
        raise RagrlError(f"{path}: field 'params' must be an object")
    return manifest


def require_files(directory: str | Path, *names: str) -> None:
    d = Path(directory)
    missing = [n for n in names if not (d / n).exists()]
    if missing:
        raise RagrlError(f"{d}: incomplete index, missing {', '.join(missing)}")


def save_corpus(directory: str | Path, passages: Iterable[Passage]) -> int:
    """The index's passages, streamed into ``corpus.jsonl`` and its offsets (``ragrl.retrieval.store``)."""
    return PassageStore.write(directory, passages)


def load_corpus(directory: str | Path, expected: int | None = None) -> PassageStore:
    """The index's passages, on disk and read on demand; ``expected``: the manifest's count."""
    return PassageStore.open(directory, expected)


INDEX_TYPES: Registry[Any] = Registry("retriever type")
register_index_type = INDEX_TYPES.register
"""Register a retriever class (with ``load(directory, **options)``) under the ``type`` its index
manifests carry; ``ragrl.retrieval`` registers bm25, dense and hybrid when it is imported."""


def load_retriever(directory: str | Path, **options: Any) -> Retriever:
    """Load any index directory written by ``save``.

    ``options`` go to the class's ``load`` where it accepts them and are ignored otherwise, so one
    call can carry ``device=``/``batch_size=`` (dense) and ``n_threads=`` (bm25) for any index,
    hybrid components included.
    """
    manifest = read_manifest(directory)
    kind = manifest["type"]
    if kind not in INDEX_TYPES:
        raise RagrlError(
            f"{Path(directory) / MANIFEST_NAME}: unknown retriever type {kind!r} "
            f"(expected {', '.join(INDEX_TYPES.names())})"
        )
    cls = INDEX_TYPES[kind]
    accepted = inspect.signature(cls.load).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in accepted.values()):
        options = {k: v for k, v in options.items() if k in accepted}
    return cls.load(directory, **options)


def directory_size(directory: str | Path) -> int:
    return sum(p.stat().st_size for p in Path(directory).rglob("*") if p.is_file())
