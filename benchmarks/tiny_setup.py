"""What the model benchmarks share: a work folder (temporary unless given) holding the synthetic world
(seed 0, small) and a tiny policy of a given width and depth, built once and reused; and what the
method comparisons share: a seed's world, index and copy-pre-trained policy (``world``), the
warm-start-then-GRPO pipeline each arm runs, the held-out scores with the collapse check (``scores``)
and a summary of the training log (``training_summary``); one arm run end to end (``compare_arm``), the
comparisons' shared command line (``add_comparison_args``), their seed × arm loop (``run_comparison``)
and results table (``print_results``)."""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ragrl.data.io import read_corpus, read_examples
from ragrl.eval.runner import collapse_check, evaluate
from ragrl.llm.tiny import CopyPretraining, TinyConfig, create_tiny_policy
from ragrl.methods import load_method, vocabulary_texts
from ragrl.metrics.normalize import normalize
from ragrl.retrieval.base import load_retriever
from ragrl.retrieval.bm25 import BM25Retriever
from ragrl.synth import generate_world
from ragrl.synth.demonstrators import OracleDemonstrator
from ragrl.synth.questions import UNANSWERABLE_ANSWER
from ragrl.train.demo import DEFAULT_COPY_STEPS
from ragrl.train.from_base import base_demonstrator, base_overrides  # noqa: F401 - the comparisons' use
from ragrl.train.reader import resolve_base  # noqa: F401 - the comparisons' --base


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


def world(
    workdir: Path, seed: int, copy_steps: int, policy: bool = True, base: Path | None = None
) -> tuple[Path, Path, Path]:
    """The folders of seed ``seed``'s world, its BM25 index and its policy: the pretrained reader
    ``base`` when given, else a tiny policy with the demo's copy pre-training (built when missing; not
    built with ``policy=False``)."""
    data = workdir / f"world-{seed}"
    if not (data / "train.jsonl").is_file():
        generate_world(seed, "small").write(data)
    index = data / "bm25"
    if not index.is_dir():
        BM25Retriever.build(read_corpus(data / "corpus.jsonl")[0]).save(index)
    if base is not None:
        return data, index, base
    model_dir = workdir / f"policy-{seed}-copy{copy_steps}"
    if policy and not (model_dir / "config.json").is_file():
        create_tiny_policy(
            data, model_dir, seed=seed, copy=CopyPretraining(steps=copy_steps), extra_texts=vocabulary_texts()
        )
    return data, index, model_dir


def scores(
    backend: Any, retriever: Any, method: Any, examples: list, columns: Sequence[str]
) -> dict[str, Any]:  # noqa: ANN401
    """Greedy held-out scores (``columns`` of the evaluation report), plus EM on the answerable
    questions only, the most common answer and its share (the collapse check), and the share of
    ``unknown`` answers (always answering ``unknown`` scores the unanswerable share of EM without
    searching)."""
    report = evaluate(backend, retriever, method, examples)
    out: dict[str, Any] = {k: round(float(report.scores[k]), 3) for k in columns if k in report.scores}
    check = collapse_check(report.rows, examples)
    out["em_answerable"] = round(check["eval/em_answerable"], 3)
    out["top_answer_share"] = round(check["eval/top_answer_share"], 3)
    out["top_answer"] = check["eval/top_answer"]
    unknown = [normalize(str(r["prediction"] or "")) == UNANSWERABLE_ANSWER for r in report.rows]
    out["unknown_rate"] = round(statistics.mean(unknown), 3) if unknown else 0.0
    return out


def training_summary(metrics: Path, extra: Sequence[str] = ()) -> dict[str, float]:
    """Means over a GRPO run's log: the zero-variance share, and the reward and searches of the first
    and the last 10 steps; ``extra`` keys over the whole run (those the log has)."""
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    rows = [r for r in rows if r.get("kind") == "train"]

    def mean(key: str, part: list[dict]) -> float:
        return round(statistics.mean(r[key] for r in part), 3)

    out = {
        "zero_variance_frac": mean("zero_variance_frac", rows),
        "reward_first10": mean("reward", rows[:10]),
        "reward_last10": mean("reward", rows[-10:]),
        "searches_first10": mean("searches", rows[:10]),
        "searches_last10": mean("searches", rows[-10:]),
    }
    out.update({key: mean(key, rows) for key in extra if rows and all(key in r for r in rows)})
    return out


def compare_arm(
    workdir: Path, seed: int, arm: str, config: str, overrides: Sequence[str], *, sft_steps: int, steps: int,
    copy_steps: int, columns: Sequence[str], training: Sequence[str] = (), extra: Sequence[str] = (),
    base: Path | None = None,
) -> dict[str, Any]:  # fmt: skip
    """One arm of a method comparison on seed ``seed``'s world: the packaged ``config`` with
    ``overrides`` (then the seed's paths and the step counts, then ``extra``: the user's ``--set``), a
    warm start on the method's oracle (the world's search oracle when it has none), then
    GRPO; the held-out ``scores`` before and after, and the ``training_summary`` (with ``training``).
    Both question sets are the method's own (``Method.prepare_examples``, as ``ragrl eval`` has them).
    With a reader ``base`` the arm starts from it with ``base_overrides`` and ``base_demonstrator``."""
    data, index, model_dir = world(workdir, seed, copy_steps, base=base)
    if base is not None:
        overrides = [*overrides, *base_overrides(config, overrides)]
    train = read_examples(data / "train.jsonl")[0]
    test = read_examples(data / "test.jsonl")[0]
    retriever = load_retriever(index)
    out = workdir / f"{arm}-{seed}"
    method = load_method(
        config,
        [*overrides, f"train.seed={seed}", f"train.model.path={model_dir}", f"train.out={out}",
         f"train.sft.max_steps={sft_steps}", f"train.steps={steps}",
         f"train.sft.world={data / 'world.json'}", *extra],  # the names train.sft.name_swap swaps
    )  # fmt: skip
    train = method.prepare_examples(train, "train")  # the questions the method trains and is scored on
    test = method.prepare_examples(test, "test")
    t0 = time.perf_counter()
    demonstrator = base_demonstrator(method) if base is not None else method.oracle or OracleDemonstrator()
    grpo = warm_start_then_grpo(method, demonstrator, train, retriever, out)
    before = scores(grpo.backend, retriever, method, test, columns)
    grpo.train()
    after = scores(grpo.backend, retriever, method, test, columns)
    return {"seed": seed, "arm": arm, "n_test": len(test), "before": before, "after": after,
            "training": training_summary(out / "metrics.jsonl", training),
            "seconds": round(time.perf_counter() - t0, 1)}  # fmt: skip


def add_comparison_args(ap: argparse.ArgumentParser, *, sft_steps: int, steps: int) -> None:
    """``--seeds``, ``--sft-steps``, ``--steps``, ``--copy-steps``, ``--workdir`` and ``--set``."""
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--sft-steps", type=int, default=sft_steps)
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument(
        "--copy-steps", type=int, default=DEFAULT_COPY_STEPS, help="copy pre-training (as the demo)"
    )
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument(
        "--base", default="scratch",
        help="scratch (a tiny policy per world: the docs' tables), shipped (the reader base) or a folder",
    )  # fmt: skip
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="config override (all arms)")


def run_comparison(
    args: argparse.Namespace, arms: Sequence[str], prefix: str, run: Callable[..., dict[str, Any]]
) -> list[dict[str, Any]]:
    """``run(workdir, seed, arm, args)`` for every seed and arm, each result printed as a JSON line as it
    comes; all of them written to ``results.jsonl`` in the work folder (temporary unless ``--workdir``)."""
    tmp, workdir = open_workdir(args.workdir, prefix)
    results = []
    for seed in args.seeds:
        for arm in arms:
            r = run(workdir, seed, arm, args)
            results.append(r)
            print(json.dumps(r), flush=True)
    (workdir / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in results), encoding="utf-8")
    if tmp is not None:
        tmp.cleanup()
    return results


def print_results(results: Sequence[dict[str, Any]], columns: Sequence[str], training: Sequence[str]) -> None:
    """A markdown table: one row per run and phase (before, after), ``training`` on the after rows."""
    print(f"\n| seed | arm | questions | phase | {' | '.join(columns)} | {' | '.join(training)} |")
    print("|---|---|---|---|" + "---|" * (len(columns) + len(training)))
    for r in results:
        for phase in ("before", "after"):
            cells = " | ".join(str(r[phase].get(k, "—")) for k in columns)
            train = " | ".join(str(r["training"].get(k, "—")) if phase == "after" else "" for k in training)
            print(f"| {r['seed']} | {r['arm']} | {r['n_test']} | {phase} | {cells} | {train} |")
