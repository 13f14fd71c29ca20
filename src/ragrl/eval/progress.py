"""An evaluation that survives being stopped: its episodes kept chunk by chunk, resumed where it stopped.

``ragrl eval`` writes two files into its output folder while it runs:

``progress.json``              what the evaluation is (model, data and its sha256, index, the resolved
                               method's sha256, questions, temperature, seed, ...): a resume must be the
                               same evaluation;
``trajectories.partial.jsonl`` the episodes of every chunk that ended, appended and flushed to disk as
                               each chunk ends.

``ragrl eval ... --resume`` reads them back and rolls out only the questions after them; every later
episode gets the seed it would have had (``evaluate``'s global group numbering), so a resumed evaluation
scores what an uninterrupted one does. Both files go once the evaluation's own files are written. A last
line cut by a kill mid-write is dropped, on reading and from the file, and the rollout restarts at its
episode; any other bad line is an error.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ragrl.data.io import atomic_write
from ragrl.errors import DataError, RagrlError
from ragrl.rollout.records import trajectory_from_record
from ragrl.rollout.trajectory import Trajectory

PROGRESS = "progress.json"
PARTIAL = "trajectories.partial.jsonl"


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


MIB = 1 << 20


def model_fingerprint(model: str | Path) -> str:
    """A cheap fingerprint of a model folder: every file's name and size, a small file (config, tokenizer,
    up to 2 MiB) whole, a larger one (weights) by its first and last MiB, so a retrained checkpoint saved
    over the folder (its last tensors changed) is seen without reading gigabytes. Hidden files and folders
    (``.git``, ``.cache``: a second copy of the weights, download times) are left out."""
    model = Path(model)
    digest = hashlib.sha256()
    files = [
        p
        for p in model.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.parts[len(model.parts) :])
    ]
    for path in sorted(files):
        try:
            size = path.stat().st_size
            digest.update(os.fsencode(path.relative_to(model)) + f"\0{size}\0".encode())
            with open(path, "rb") as f:
                digest.update(f.read(2 * MIB if size <= 2 * MIB else MIB))
                if size > 2 * MIB:
                    f.seek(size - MIB)
                    digest.update(f.read(MIB))
        except OSError as e:
            raise RagrlError(f"{path}: cannot be read to fingerprint the model ({e.strerror or e})") from None
    return digest.hexdigest()


class EvalProgress:
    """The episodes an evaluation has finished, kept in ``folder`` (see the module's docstring)."""

    def __init__(self, folder: str | Path, settings: dict[str, Any], kept: int = 0) -> None:
        self.folder = Path(folder)
        self.settings = settings
        self.kept = kept
        """How many episodes are on disk."""

    @classmethod
    def start(cls, folder: str | Path, settings: dict[str, Any]) -> EvalProgress:
        """A new evaluation's record in ``folder`` (an earlier interrupted one's is replaced)."""
        progress = cls(folder, settings)
        progress.folder.mkdir(parents=True, exist_ok=True)
        (progress.folder / PARTIAL).write_text("", encoding="utf-8")
        atomic_write(
            progress.folder / PROGRESS, lambda f: f.write(json.dumps(settings, indent=2) + "\n"), "w"
        )
        return progress

    @classmethod
    def resume(cls, folder: str | Path, settings: dict[str, Any]) -> tuple[EvalProgress, list[Trajectory]]:
        """The interrupted evaluation in ``folder`` and its finished episodes; a ``RagrlError`` when there
        is none or it was another evaluation (naming each setting that differs)."""
        folder = Path(folder)
        path = folder / PROGRESS
        if not path.is_file():
            raise RagrlError(f"{folder}: holds no interrupted evaluation to resume ({PROGRESS} is missing)")
        try:
            recorded = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise DataError(f"not JSON ({e.msg})", path=path, line=e.lineno) from None
        differ = [
            key for key in sorted(set(recorded) | set(settings)) if recorded.get(key) != settings.get(key)
        ]
        if differ:
            what = "; ".join(f"{k}: {recorded.get(k)!r} then, {settings.get(k)!r} now" for k in differ)
            raise RagrlError(
                f"{folder}: --resume continues the same evaluation, and this one differs ({what})"
            )
        drop_cut_line(folder / PARTIAL)  # first: a line cut by a kill must not prefix the next append
        episodes = read_partial(folder / PARTIAL)
        return cls(folder, settings, kept=len(episodes)), episodes

    def append(self, episodes: Sequence[Trajectory]) -> None:
        """A chunk's episodes, appended and on disk before this returns."""
        with open(self.folder / PARTIAL, "a", encoding="utf-8") as f:
            for episode in episodes:
                f.write(json.dumps(episode.to_dict(), ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.kept += len(episodes)

    def finish(self) -> None:
        """The evaluation's own files are written: its progress files go."""
        for name in (PARTIAL, PROGRESS):
            (self.folder / name).unlink(missing_ok=True)


def drop_cut_line(path: Path) -> None:
    """Truncate the file after its last newline (on disk before this returns); nothing to do when it
    ends with one."""
    if not path.is_file():
        return
    with open(path, "r+b") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return
        f.seek(0)
        data = f.read()
        f.truncate(data.rfind(b"\n") + 1)
        f.flush()
        os.fsync(f.fileno())


def count_partial(path: Path) -> int:
    """How many whole episodes a partial file holds (its complete lines), without parsing them."""
    if not path.is_file():
        return 0
    with open(path, "rb") as f:
        return sum(1 for line in f if line.endswith(b"\n") and line.strip())


def read_partial(path: Path) -> list[Trajectory]:
    """The episodes of a partial file; a last line without its newline (cut by a kill) is dropped."""
    if not path.is_file():
        return []
    data = path.read_bytes()
    lines = data[: data.rfind(b"\n") + 1].split(b"\n")[:-1]  # a last line cut before its newline: out
    episodes = []
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DataError(f"not UTF-8 ({e.reason})", path=path, line=number) from None
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"not JSON ({e.msg})", path=path, line=number) from None
        if not isinstance(record, dict):
            raise DataError(f"expected a JSON object, got {type(record).__name__}", path=path, line=number)
        episodes.append(trajectory_from_record(record, path, number))
    return episodes
