"""Trajectories on disk: one ``Trajectory.to_dict()`` a line of a jsonl file, written atomically and read
back with errors that name the file and line.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ragrl.data.io import iter_jsonl, write_jsonl
from ragrl.errors import DataError
from ragrl.rollout.trajectory import Segment, Trajectory


def write_trajectories(path: str | Path, trajectories: Sequence[Trajectory]) -> int:
    """Write trajectories as jsonl (one ``Trajectory.to_dict()`` per line, atomically); returns the count."""
    return write_jsonl(path, (t.to_dict() for t in trajectories))


def read_trajectories(path: str | Path) -> list[Trajectory]:
    """Read a trajectory jsonl file; a bad line raises ``DataError`` naming the file and line."""
    out: list[Trajectory] = []
    for line, record in iter_jsonl(path):
        if not isinstance(record, dict):
            raise DataError(f"expected a JSON object, got {type(record).__name__}", path=path, line=line)
        out.append(trajectory_from_record(record, path, line))
    return out


def trajectory_from_record(record: dict, path: str | Path, line: int) -> Trajectory:
    """One saved trajectory (``Trajectory.to_dict()``); a malformed one raises ``DataError`` naming the
    file and line."""
    try:
        traj = Trajectory.from_dict(record)
        if not isinstance(traj.prompt_ids, list) or not all(isinstance(s, Segment) for s in traj.segments):
            raise TypeError("malformed fields")
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        raise DataError(f"not a trajectory record ({e})", path=path, line=line) from None
    return traj
