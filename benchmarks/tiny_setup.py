"""What the model benchmarks share: a work folder (temporary unless given) holding the synthetic world
(seed 0, small) and a tiny policy of a given width and depth, built once and reused; and the
warm-start-then-GRPO pipeline the method comparisons run for each arm."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from ragrl.llm.tiny import TinyConfig, create_tiny_policy
from ragrl.methods import vocabulary_texts
from ragrl.synth import generate_world


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
        create_tiny_policy(data, model, seed=0, config=config, extra_texts=vocabulary_texts())
    return data, model


def warm_start_then_grpo(method: Any, demonstrator: Any, train: list, retriever: Any, out: Path) -> Any:  # noqa: ANN401
    """SFT on ``demonstrator``'s trajectories over ``train`` (``method.train.sft``), then a
    ``GRPOTrainer`` from that policy (not yet trained: evaluate with its ``backend``, then ``train()``).
    The warm start's run folder is ``out/warm_start``."""
    from ragrl.train.grpo import GRPOTrainer
    from ragrl.train.setup import load_policy, make_accelerator
    from ragrl.train.sft import SFTTrainer, demonstration_trajectories

    config = method.train
    accelerator = make_accelerator(config)
    model, tokenizer = load_policy(config.model, accelerator.device)
    demos = demonstration_trajectories(method, tokenizer, demonstrator, train, retriever)
    sft = SFTTrainer(
        method, config, demos, run_dir=out / "warm_start", eval_examples=[], retriever=retriever,
        accelerator=accelerator, model=model, tokenizer=tokenizer,
    )  # fmt: skip
    sft.train()
    return GRPOTrainer(
        method, config, run_dir=out, train_examples=train, eval_examples=[], retriever=retriever,
        accelerator=make_accelerator(config), model=sft.policy, tokenizer=tokenizer,
    )  # fmt: skip
