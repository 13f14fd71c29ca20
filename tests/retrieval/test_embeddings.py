"""Passage embeddings on disk: shards that a killed build keeps, the vector file, the hashing encoder."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from ragrl.errors import RagrlError
from ragrl.retrieval.embeddings import (
    HashingEncoder,
    VectorFile,
    encode_shards,
    hashing_dim,
    join_shards,
    read_shard,
)
from ragrl.synth.scale import synthetic_corpus

PASSAGES = list(synthetic_corpus(25, seed=1, words=20))
SETTINGS = {"model": "hashing:16", "passage_prefix": "", "normalize": True}


class Counting:
    """The hashing encoder, counting the passages it encodes; ``fail_at``: the call that dies."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.encoder, self.calls, self.encoded, self.fail_at = HashingEncoder(16), 0, 0, fail_at

    def __call__(self, texts):
        self.calls += 1
        if self.calls == self.fail_at:
            raise KeyboardInterrupt  # the build killed in the middle of a shard
        self.encoded += len(texts)
        return self.encoder.encode(texts)


def test_a_killed_build_keeps_its_finished_shards_and_encodes_only_the_rest(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        encode_shards(Counting(fail_at=3), PASSAGES, tmp_path, settings=SETTINGS, shard_size=10)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "shard-00000.f32", "shard-00000.json", "shard-00001.f32", "shard-00001.json",
    ]  # fmt: skip
    again = Counting()
    files, kept = encode_shards(again, PASSAGES, tmp_path, settings=SETTINGS, shard_size=10)
    assert kept == 2 and again.encoded == 5 and len(files) == 3
    whole = np.concatenate([read_shard(f, 16) for f in files])
    assert np.array_equal(whole, HashingEncoder(16).encode([p.contents for p in PASSAGES]))
    # a shard of other passages or of another encoder is encoded again, never reused
    changed = [dataclasses.replace(PASSAGES[0], text="another text"), *PASSAGES[1:]]
    third = Counting()
    _, kept = encode_shards(third, changed, tmp_path, settings=SETTINGS, shard_size=10)
    assert kept == 2 and third.encoded == 10
    fourth = Counting()
    _, kept = encode_shards(
        fourth, changed, tmp_path, settings={**SETTINGS, "normalize": False}, shard_size=10
    )
    assert kept == 0 and fourth.encoded == 25
    # a shard file cut short (the disk filled) is encoded again
    (tmp_path / "shard-00002.f32").write_bytes(b"\0" * 8)
    fifth = Counting()
    _, kept = encode_shards(
        fifth, changed, tmp_path, settings={**SETTINGS, "normalize": False}, shard_size=10
    )
    assert kept == 2 and fifth.encoded == 5


def test_the_vector_file_reads_rows_and_blocks_and_checks_its_size(tmp_path):
    files, _ = encode_shards(Counting(), PASSAGES, tmp_path / "s", settings=SETTINGS, shard_size=10)
    assert join_shards(files, 16, tmp_path / "vectors.f32") == 25
    vectors = VectorFile(tmp_path / "vectors.f32", 16, 25)
    whole = HashingEncoder(16).encode([p.contents for p in PASSAGES])
    assert np.array_equal(vectors.take(np.array([24, 3, 3])), whole[[24, 3, 3]])
    assert np.array_equal(np.concatenate([b for _, b in vectors.blocks(block_rows=7)]), whole)
    with pytest.raises(RagrlError, match=r"vectors.f32: 1600 bytes, expected 26 vectors of 16 float32"):
        VectorFile(tmp_path / "vectors.f32", 16, 26)
    assert vectors.take(np.array([], dtype=np.int64)).shape == (0, 16)
    for bad in (25, -1):  # past the end, or negative: refused before any read, both named
        with pytest.raises(RagrlError, match=rf"no row {bad} \(the file holds rows 0 to 24\)"):
            vectors.take(np.array([0, bad]))
    with open(tmp_path / "vectors.f32", "r+b") as f:  # cut short after loading: an error naming the file
        f.truncate(800)
    with pytest.raises(RagrlError, match=r"vectors.f32: 0 bytes at byte 1536, expected 64 .the file shrank."):
        vectors.take(np.array([24]))
    vectors.close()
    with pytest.raises(RagrlError, match="the vector file is closed"):
        vectors.take(np.array([0]))


def test_the_hashing_encoder_is_deterministic_normalised_and_lexical():
    enc = HashingEncoder(64)
    a, b, c = enc.encode(["The harbour town of Kestrel Bay", "kestrel bay, the HARBOUR town of", "Olvana"])
    assert np.allclose(a, b) and np.linalg.norm(a) == pytest.approx(1.0) and a @ c < 0.5
    assert np.array_equal(HashingEncoder(64).encode(["x y"]), enc.encode(["x y"]))  # no state across objects
    assert hashing_dim("hashing:384") == 384 and hashing_dim("bundled:all-MiniLM-L6-v2") is None
    with pytest.raises(RagrlError, match="'hashing:DIM'"):
        hashing_dim("hashing:big")
