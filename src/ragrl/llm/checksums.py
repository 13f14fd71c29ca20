"""``SHA256SUMS``: a model folder that ships one has every file checked when it is loaded.

The file is the ``sha256sum`` format (``<hex digest>  <relative path>`` per line, or ``<hex> *<path>``
in binary mode), so ``sha256sum -c SHA256SUMS`` checks the same folder from a shell. The shipped reader
base has one (``ragrl.train.reader``); a folder without it loads unchecked, as any checkpoint. A listed
file that is missing or changed, a file of the folder that is not listed, a path outside the folder and
an empty list are all errors naming the file.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from ragrl.errors import RagrlError

SUMS = "SHA256SUMS"
_LINE = re.compile(r"^([0-9a-f]{64}) [ *](.+)$")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != SUMS)


def write_checksums(folder: str | Path) -> Path:
    """Write ``SHA256SUMS`` for every file under ``folder`` (itself aside); returns its path."""
    folder = Path(folder)
    lines = [f"{file_sha256(p)}  {p.relative_to(folder).as_posix()}" for p in _files(folder)]
    path = folder / SUMS
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def verify_checksums(folder: str | Path, rebuild: str = "") -> int:
    """Check the folder against its ``SHA256SUMS`` (nothing if it has none); returns how many files were
    checked. ``rebuild`` says how to make the folder again, in the errors."""
    folder = Path(folder)
    path = folder / SUMS
    if not path.is_file():
        return 0
    hint = f" (rebuild it: {rebuild})" if rebuild else ""
    root = folder.resolve()
    listed: set[Path] = set()
    for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        match = _LINE.match(line)
        if match is None:
            raise RagrlError(f"{path}:{line_no}: not a '<sha256>  <file>' line")
        want, name = match.groups()
        file = (folder / name).resolve()
        if Path(name).is_absolute() or not file.is_relative_to(root):
            raise RagrlError(f"{path}:{line_no}: {name!r} lies outside {folder}")
        if not file.is_file():
            raise RagrlError(f"{folder / name}: listed in {SUMS} but missing{hint}")
        got = file_sha256(file)
        if got != want:
            raise RagrlError(
                f"{folder / name}: sha256 {got[:12]}... is not {SUMS}'s {want[:12]}... "
                f"(changed or damaged){hint}"
            )
        listed.add(file)
    if not listed:
        raise RagrlError(f"{path}: lists no file")
    extra = [p for p in _files(folder) if p.resolve() not in listed]
    if extra:
        raise RagrlError(f"{extra[0]}: not listed in {path} (a file added to a checked folder)")
    return len(listed)
