"""Reciprocal Rank Fusion (Cormack et al., 2009) of two retrievers.

For each query both components are searched to depth ``max(k, depth)``; a passage's fused score is
``sum over components of 1 / (rrf_k + rank)`` (rank counted from 1; a component that did not return
the passage contributes nothing). Ties are broken by the passage's best rank in any component, then by
passage id, so results are deterministic. The saved directory holds the two components as
subdirectories ``a/`` and ``b/`` next to its own ``retriever.json``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ragrl.errors import RagrlError
from ragrl.retrieval.base import (
    MANIFEST_NAME,
    Hit,
    Retriever,
    check_k,
    load_retriever,
    make_fingerprint,
    read_manifest,
    register_index_type,
    write_manifest,
)

COMPONENT_DIRS = ("a", "b")


def rrf_fuse(runs: list[list[Hit]], k: int, rrf_k: float = 60.0) -> list[Hit]:
    """Fuse ranked hit lists of one query; returns at most ``k`` hits with RRF scores."""
    fused: dict[str, list[Any]] = {}  # id -> [score, best rank, passage]
    for hits in runs:
        for rank, hit in enumerate(hits, start=1):
            entry = fused.get(hit.passage.id)
            if entry is None:
                fused[hit.passage.id] = [1.0 / (rrf_k + rank), rank, hit.passage]
            else:
                entry[0] += 1.0 / (rrf_k + rank)
                entry[1] = min(entry[1], rank)
    ordered = sorted(fused.items(), key=lambda item: (-item[1][0], item[1][1], item[0]))
    return [Hit(entry[2], entry[0]) for _, entry in ordered[:k]]


@register_index_type("hybrid")
class HybridRetriever:
    kind = "hybrid"

    def __init__(self, a: Retriever, b: Retriever, *, rrf_k: float = 60.0, depth: int = 100) -> None:
        if rrf_k < 0:
            raise RagrlError(f"rrf_k must be >= 0, got {rrf_k}")
        self.a, self.b = a, b
        self.rrf_k, self.depth = float(rrf_k), int(depth)
        self._fingerprint = make_fingerprint(self.kind, self.params, self.corpus_hash)

    @property
    def params(self) -> dict[str, Any]:
        return {
            "rrf_k": self.rrf_k,
            "depth": self.depth,
            "components": [self.a.fingerprint, self.b.fingerprint],
        }

    @property
    def corpus_hash(self) -> str:
        ha = getattr(self.a, "corpus_hash", self.a.fingerprint)
        hb = getattr(self.b, "corpus_hash", self.b.fingerprint)
        return ha if ha == hb else make_fingerprint("corpora", {}, ha + hb)

    @property
    def fingerprint(self) -> str:
        return self._fingerprint

    def __repr__(self) -> str:
        return f"HybridRetriever({self.a!r}, {self.b!r}, rrf_k={self.rrf_k}, depth={self.depth})"

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        check_k(k)
        if not queries:
            return []
        depth = max(k, self.depth)
        runs_a = self.a.search(queries, depth)
        runs_b = self.b.search(queries, depth)
        return [rrf_fuse([ha, hb], k, self.rrf_k) for ha, hb in zip(runs_a, runs_b, strict=True)]

    def save(self, directory: str | Path) -> None:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        (d / MANIFEST_NAME).unlink(missing_ok=True)  # written last: a save cut short leaves no index
        for name, component in zip(COMPONENT_DIRS, (self.a, self.b), strict=True):
            component.save(d / name)
        write_manifest(
            d, self.kind, self.params, self.corpus_hash, self.fingerprint, component_dirs=list(COMPONENT_DIRS)
        )

    @classmethod
    def load(cls, directory: str | Path, **options: Any) -> HybridRetriever:
        """Load both components; ``options`` go to each component's loader that accepts them."""
        d = Path(directory)
        manifest = read_manifest(d)
        if manifest["type"] != cls.kind:
            raise RagrlError(f"{d}: is a {manifest['type']!r} index, not a hybrid index")
        names = manifest.get("component_dirs", list(COMPONENT_DIRS))
        components = [load_retriever(d / name, **options) for name in names]
        params = manifest["params"]
        return cls(
            components[0], components[1], rrf_k=params.get("rrf_k", 60.0), depth=params.get("depth", 100)
        )
