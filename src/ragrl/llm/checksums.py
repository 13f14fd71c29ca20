"""``SHA256SUMS``: a model folder that ships one has every listed file checked when it is loaded.

The file is the ``sha256sum`` format (``<hex digest>  <relative path>`` per line), so ``sha256sum -c
SHA256SUMS`` checks the same folder from a shell. The shipped reader base has one
(``ragrl.train.reader``); a folder without it loads unchecked, as any checkpoint.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from ragrl.errors import RagrlError

SUMS = "SHA256SUMS"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_checksums(folder: str | Path) -> Path:
    """Write ``SHA256SUMS`` for every file under ``folder`` (itself aside); returns its path."""
    folder = Path(folder)
    lines = [
        f"{file_sha256(p)}  {p.relative_to(folder).as_posix()}"
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != SUMS
    ]
    path = folder / SUMS
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def verify_checksums(folder: str | Path, rebuild: str = "") -> int:
    """Check every file ``SHA256SUMS`` lists (none if there is no such file); returns how many were
    checked. A missing or changed file, or a malformed line, is an error naming it; ``rebuild`` says
    how to make the folder again."""
    folder = Path(folder)
    path = folder / SUMS
    if not path.is_file():
        return 0
    hint = f" (rebuild it: {rebuild})" if rebuild else ""
    checked = 0
    for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        want, sep, name = line.partition("  ")
        if not sep or len(want) != 64 or not name:
            raise RagrlError(f"{path}:{line_no}: not a '<sha256>  <file>' line")
        file = folder / name
        if not file.is_file():
            raise RagrlError(f"{file}: listed in {SUMS} but missing{hint}")
        got = file_sha256(file)
        if got != want:
            raise RagrlError(
                f"{file}: sha256 {got[:12]}... is not {SUMS}'s {want[:12]}... (changed or damaged){hint}"
            )
        checked += 1
    return checked
