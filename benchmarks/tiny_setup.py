"""What the model benchmarks share: a work folder (temporary unless given) holding the synthetic world
(seed 0, small) and a tiny policy of a given width and depth, built once and reused."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from ragrl.data.synth import generate_world
from ragrl.llm.tiny import TinyConfig, create_tiny_policy


def add_model_args(ap: argparse.ArgumentParser) -> None:
    """``--workdir``, ``--hidden`` and ``--layers``."""
    ap.add_argument("--workdir", type=Path, default=None, help="keep data and model here (reused)")
    ap.add_argument(
        "--hidden", type=int, default=TinyConfig.hidden, help="policy width (default: the tiny policy)"
    )
    ap.add_argument("--layers", type=int, default=TinyConfig.layers, help="policy depth")


def open_workdir(given: Path | None, prefix: str) -> tuple[tempfile.TemporaryDirectory | None, Path]:
    """``(None, given)`` with ``given`` created if missing, or a temporary folder (call ``cleanup()`` on
    the first element when done)."""
    if given is not None:
        given.mkdir(parents=True, exist_ok=True)
        return None, given
    tmp = tempfile.TemporaryDirectory(prefix=prefix)
    return tmp, Path(tmp.name)


def world_and_policy(workdir: Path, hidden: int, layers: int) -> tuple[Path, Path]:
    """The world's folder and the tiny policy's folder under ``workdir`` (built when missing)."""
    data, model = workdir / "data", workdir / f"model-h{hidden}-l{layers}"
    if not (data / "corpus.jsonl").is_file():
        generate_world(0, "small").write(data)
    if not (model / "config.json").is_file():
        config = TinyConfig(hidden=hidden, layers=layers, heads=max(2, hidden // 32), intermediate=3 * hidden)
        create_tiny_policy(data, model, seed=0, config=config)
    return data, model
