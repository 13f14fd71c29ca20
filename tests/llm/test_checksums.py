"""``SHA256SUMS`` in a model folder: written, checked on every load, a changed file named."""

from __future__ import annotations

import hashlib

import pytest

from ragrl.errors import RagrlError
from ragrl.llm.checksums import SUMS, verify_checksums, write_checksums


def test_written_in_sha256sum_format_and_verified(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "tokenizer.json").write_text("{}")
    write_checksums(tmp_path)
    lines = (tmp_path / SUMS).read_text().splitlines()
    assert lines == [
        f"{hashlib.sha256(b'weights').hexdigest()}  model.safetensors",
        f"{hashlib.sha256(b'{}').hexdigest()}  sub/tokenizer.json",
    ]
    assert verify_checksums(tmp_path) == 2
    assert verify_checksums(tmp_path / "sub") == 0  # no SHA256SUMS: nothing to check


def test_a_changed_or_missing_file_is_named(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    write_checksums(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"weightz")
    with pytest.raises(
        RagrlError, match=r"model\.safetensors: sha256 .*(changed or damaged).*make reader-base"
    ):
        verify_checksums(tmp_path, rebuild="make reader-base")
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(RagrlError, match="missing"):
        verify_checksums(tmp_path)
    (tmp_path / SUMS).write_text("not a line\n")
    with pytest.raises(RagrlError, match=r"SHA256SUMS:1"):
        verify_checksums(tmp_path)


def test_loading_a_model_folder_checks_it(tmp_path):
    from ragrl.llm.hf_backend import TransformersBackend
    from ragrl.llm.tiny import build_tiny_model, train_tokenizer

    tok = train_tokenizer(["a tiny corpus of words for the tokenizer"], kind="word", vocab_size=256)
    model = build_tiny_model(tok)
    tok.save_pretrained(tmp_path)
    model.save_pretrained(tmp_path)
    write_checksums(tmp_path)
    TransformersBackend(str(tmp_path))  # loads
    weights = tmp_path / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    with pytest.raises(RagrlError, match=r"model\.safetensors: sha256"):
        TransformersBackend(str(tmp_path))


def test_paths_outside_the_folder_unlisted_files_and_binary_mode(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "a.bin").write_bytes(b"a")
    (tmp_path / "outside").write_bytes(b"x")
    digest = hashlib.sha256(b"a").hexdigest()
    (folder / SUMS).write_text(f"{digest} *a.bin\n")  # sha256sum -b writes a '*'
    assert verify_checksums(folder) == 1
    (folder / SUMS).write_text(f"{digest}  a.bin\n{hashlib.sha256(b'x').hexdigest()}  ../outside\n")
    with pytest.raises(RagrlError, match="lies outside"):
        verify_checksums(folder)
    (folder / SUMS).write_text(f"{digest}  a.bin\n")
    (folder / "b.bin").write_bytes(b"b")
    with pytest.raises(RagrlError, match=r"b\.bin: not listed"):
        verify_checksums(folder)
    (folder / SUMS).write_text("\n")
    with pytest.raises(RagrlError, match="lists no file"):
        verify_checksums(folder)
    (folder / SUMS).write_text(f"{digest.upper()}  a.bin\n")
    with pytest.raises(RagrlError, match="SHA256SUMS:1"):
        verify_checksums(folder)
